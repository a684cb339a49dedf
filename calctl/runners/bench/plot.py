"""Bench pictures (matplotlib, Agg): one PNG per scenario, written atomically.

* :func:`plot_ab` – tokens/s per steady-state window for A and B isolated and
  joint, and P99 TTFT / TPOT per model isolated against joint;
* :func:`plot_pairs` – the four prefill/decode interference pairs (001 §9.4);
* :func:`plot_timeline` – B's request latency over time with the fault phases
  shaded (fault isolation).

Every picture says where the numbers come from: the mock device, a named
device, or a server whose device the bench was not told.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from calctl.report import Tone, tone_of
from calctl.runners.plotting import device_label, pyplot, save


class BarGroup(NamedTuple):
    """One P99 comparison: a metric of a model, isolated against joint, with its samples and gate verdict."""

    label: str
    isolated: float | None  # seconds
    joint: float | None
    n_isolated: int | None = None
    n_joint: int | None = None
    verdict: str | None = None  # PASS | FAIL | NOT JUDGED of the degradation gate
    model: str | None = None


#: One colour per model in every bench picture (isolated solid, joint hatched or dashed).
MODEL_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
#: A verdict's colour in a picture, by its tone (the page's colours, calctl/_data/html/report.html.j2).
VERDICT_COLOURS = {Tone.GOOD: "#1a7f37", Tone.WARN: "#9a6700", Tone.BAD: "#cf222e", Tone.NEUTRAL: "#57606a"}


def _bars(ax: Any, groups: Sequence[BarGroup], ylabel: str, gate: float) -> None:
    """Isolated (solid) and joint (hatched) bars in the model's colour, the gate line over each pair
    (isolated x (1 + gate)), the sample count on each bar and the gate's verdict above the pair.

    The sample count stands upright just above its bar, so two neighbouring bars' counts never overlap
    however short the bars are; the y-axis leaves room above the tallest bar (or gate line) for it."""
    models = list(dict.fromkeys(g.model or g.label.split()[0] for g in groups))
    top = 0.0
    for i, g in enumerate(groups):
        c = MODEL_COLOURS[models.index(g.model or g.label.split()[0]) % len(MODEL_COLOURS)]
        for dx, value, n, hatch in ((-0.2, g.isolated, g.n_isolated, None), (0.2, g.joint, g.n_joint, "///")):
            if value is None:
                ax.text(i + dx, 0, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
                continue
            ax.bar(i + dx, value * 1e3, width=0.38, color=c, hatch=hatch, edgecolor="white", linewidth=0)
            top = max(top, value * 1e3)
            if n is not None:
                ax.annotate(
                    f"n={n}",
                    (i + dx, value * 1e3),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    rotation=90,
                    fontsize=7,
                )
        if g.isolated is not None:
            top = max(top, g.isolated * (1 + gate) * 1e3)
            limit = g.isolated * (1 + gate) * 1e3
            ax.hlines(limit, i - 0.45, i + 0.45, color="red", linestyle="--", linewidth=1.0)
        if g.verdict:
            colour = VERDICT_COLOURS[tone_of(g.verdict)]  # the tone of calctl.report.VERDICTS, as on the page
            ax.text(
                i,
                1.0,
                g.verdict,
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=8,
                color=colour,
                fontweight="bold",
            )
    ax.set_xticks(range(len(groups)), [g.label for g in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if top > 0:
        ax.set_ylim(0, max(ax.get_ylim()[1], top * 1.3))


def _bar_legend(fig: Any, gate: float) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor="#888888", label="isolated (solid)"),
        Patch(facecolor="#888888", hatch="///", edgecolor="white", label="joint (hatched)"),
        Line2D([], [], color="red", linestyle="--", label=f"gate: isolated P99 + {gate:.0%}"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)


def plot_ab(
    path: Path,
    *,
    rates: dict[str, list[float]] | None,
    window_s: float | None,
    bars: Sequence[BarGroup],
    title: str,
    device: str,
    names: tuple[str, str] = ("A", "B"),
    gate: float = 0.25,
) -> None:
    plt = pyplot()
    fig, (ax_r, ax_b) = plt.subplots(1, 2, figsize=(13, 5.2))
    if rates and window_s:
        for name in ("a_isolated", "b_isolated", "a_joint", "b_joint"):
            values = rates.get(name) or []
            k = 0 if name.startswith("a_") else 1
            xs = [(i + 1.5) * window_s for i in range(len(values))]
            if name.endswith("isolated"):  # wide and pale underneath, so the joint line on top never hides it
                ax_r.plot(
                    xs, values, "-", color=MODEL_COLOURS[k], linewidth=4, alpha=0.35, label=f"{names[k]} isolated"
                )
            else:
                ax_r.plot(
                    xs,
                    values,
                    "--",
                    marker="x",
                    markersize=5,
                    color=MODEL_COLOURS[k],
                    linewidth=1.2,
                    label=f"{names[k]} joint",
                )
        ax_r.set_xlabel("time in the phase (s)")
        ax_r.set_ylabel("tokens/s delivered (successful requests)")
        ax_r.legend(fontsize=8)
        ax_r.grid(alpha=0.3)
        ax_r.set_title("steady-state windows, same workload in every phase", fontsize=9)
    else:
        ax_r.text(0.5, 0.5, "no isolated/joint comparison in this mode", ha="center", va="center")
        ax_r.set_axis_off()
    _bars(ax_b, bars, "P99 (ms)", gate)
    ax_b.set_title("P99 TTFT and TPOT: isolated vs joint (n = samples)", fontsize=9, pad=14)
    _bar_legend(fig, gate)
    fig.suptitle(f"{title}\n{device_label(device)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, path, layout=False)


def plot_pairs(
    path: Path, pairs: Sequence[tuple[str, Sequence[BarGroup]]], *, title: str, device: str, gate: float = 0.25
) -> None:
    """The four 001 §9.4 pairs side by side on one y-scale, so the panels compare at a glance."""
    plt = pyplot()
    n = max(1, len(pairs))
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 4.8), squeeze=False, sharey=True)
    for ax, (name, groups) in zip(axes[0], pairs, strict=False):
        _bars(ax, groups, "P99 (ms)", gate)
        ax.set_title(name, fontsize=9, pad=14)
    _bar_legend(fig, gate)
    fig.suptitle(f"{title}\n{device_label(device)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, path, layout=False)


def plot_timeline(
    path: Path,
    *,
    points: Sequence[tuple[float, float | None, bool]],
    phases: Sequence[tuple[str, float, float]],
    gate_s: float | None,
    title: str,
    device: str,
) -> None:
    """``points``: (t, latency s or None, ok) of B's requests; ``phases``: (name, start, end) seconds.

    Successful requests are latencies on the latency axis; failed or refused ones have no latency, so they
    are counted per time bin on a strip of their own under it (with its count scale), never points that read
    as a latency.
    """
    plt = pyplot()
    fig, (ax, ax_f) = plt.subplots(2, 1, figsize=(13, 6), sharex=True, height_ratios=[4, 1.6])
    colours = ["#f0f0f0", "#dde8f5"]
    for i, (name, s, e) in enumerate(phases):
        for a in (ax, ax_f):
            a.axvspan(s, e, color=colours[i % 2], linewidth=0)
        ax.text((s + e) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
    ok = [(t, v * 1e3) for t, v, good in points if good and v is not None]
    bad = [t for t, _, good in points if not good]
    if ok:
        ax.scatter([t for t, _ in ok], [v for _, v in ok], s=6, color="#2ca02c", label="B succeeded (E2E)")
    if gate_s is not None:
        ax.axhline(gate_s * 1e3, color="red", linestyle="--", linewidth=0.8, label="B P99 E2E gate (baseline + 25 %)")
    ax.set_ylabel("B end-to-end latency (ms)")
    ax.legend(fontsize=8, loc="upper left")
    # B's failed or refused requests per time bin, on a count scale (ticks alone hid how many there were).
    end = max([e for _, _, e in phases] + [t for t, _, _ in points] + [1e-9])
    width = _bin_width(end)
    if bad:
        ax_f.hist(bad, bins=_bins(end, width), color="#d62728", edgecolor="white", linewidth=0.3)
    else:
        ax_f.text(0.5, 0.5, "none failed or refused", transform=ax_f.transAxes, ha="center", va="center", fontsize=8)
    ax_f.set_ylabel(f"B failed or\nrefused per {width:g} s\n({len(bad)} in all)", fontsize=8)
    ax_f.yaxis.get_major_locator().set_params(integer=True)
    ax_f.grid(axis="y", alpha=0.3)
    ax_f.set_xlabel("time (s)")
    fig.suptitle(f"{title}\n{device_label(device)}", fontsize=10)
    save(fig, path)


def _bin_width(end: float) -> float:
    """A round bin width (0.1, 0.2, 0.5, 1, 2, 5 ... s) giving about 60 bins over ``end`` seconds."""
    import math

    raw = max(end / 60, 1e-3)
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _bins(end: float, width: float) -> list[float]:
    n = max(1, int(end // width) + 1)
    return [k * width for k in range(n + 1)]


__all__ = ["BarGroup", "plot_ab", "plot_pairs", "plot_timeline"]
