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
from typing import Any

from calctl.records import atomic_output

BarGroup = tuple[str, float | None, float | None]  # label, isolated, joint (seconds)


def _device_label(device: str) -> str:
    if device == "mock":
        return "MOCK device: simulated board, not hardware evidence"
    if device == "unknown":
        return "device of the server: not stated (--target-device)"
    return f"device: {device}"


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, groups: Sequence[BarGroup], ylabel: str) -> None:
    x = range(len(groups))
    iso = [(g[1] or 0.0) * 1e3 for g in groups]
    joint = [(g[2] or 0.0) * 1e3 for g in groups]
    ax.bar([i - 0.2 for i in x], iso, width=0.4, label="isolated", color="#1f77b4")
    ax.bar([i + 0.2 for i in x], joint, width=0.4, label="joint", color="#ff7f0e")
    ax.set_xticks(list(x), [g[0] for g in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def plot_ab(
    path: Path,
    *,
    rates: dict[str, list[float]] | None,
    window_s: float | None,
    bars: Sequence[BarGroup],
    title: str,
    device: str,
    names: tuple[str, str] = ("A", "B"),
) -> None:
    plt = _pyplot()
    fig, (ax_r, ax_b) = plt.subplots(1, 2, figsize=(13, 4.8))
    if rates and window_s:
        for name, style in (("a_isolated", "-"), ("b_isolated", "-"), ("a_joint", "--"), ("b_joint", "--")):
            values = rates.get(name) or []
            model = names[0] if name.startswith("a_") else names[1]
            ax_r.plot(
                [(i + 1.5) * window_s for i in range(len(values))],
                values,
                style,
                marker="o",
                markersize=3,
                label=f"{model} {name.split('_', 1)[1]}",
            )
        ax_r.set_xlabel("time in the phase (s)")
        ax_r.set_ylabel("tokens/s delivered (successful requests)")
        ax_r.legend(fontsize=8)
        ax_r.grid(alpha=0.3)
        ax_r.set_title("steady-state windows, same workload in every phase", fontsize=9)
    else:
        ax_r.text(0.5, 0.5, "no isolated/joint comparison in this mode", ha="center", va="center")
        ax_r.set_axis_off()
    _bars(ax_b, bars, "P99 (ms)")
    ax_b.set_title("P99 TTFT and TPOT: isolated vs joint", fontsize=9)
    fig.suptitle(f"{title}\n{_device_label(device)}", fontsize=10)
    _save(fig, path)


def plot_pairs(path: Path, pairs: Sequence[tuple[str, Sequence[BarGroup]]], *, title: str, device: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, max(1, len(pairs)), figsize=(4 * max(1, len(pairs)), 4.2), squeeze=False)
    for ax, (name, groups) in zip(axes[0], pairs, strict=False):
        _bars(ax, groups, "P99 (ms)")
        ax.set_title(name, fontsize=9)
    fig.suptitle(f"{title}\n{_device_label(device)}", fontsize=10)
    _save(fig, path)


def plot_timeline(
    path: Path,
    *,
    points: Sequence[tuple[float, float | None, bool]],
    phases: Sequence[tuple[str, float, float]],
    gate_s: float | None,
    title: str,
    device: str,
) -> None:
    """``points``: (t, latency s or None, ok) of B's requests; ``phases``: (name, start, end) seconds."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(13, 4.5))
    colours = ["#f0f0f0", "#dde8f5"]
    for i, (name, s, e) in enumerate(phases):
        ax.axvspan(s, e, color=colours[i % 2], linewidth=0)
        ax.text(
            (s + e) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=7, rotation=0
        )
    ok = [(t, v * 1e3) for t, v, good in points if good and v is not None]
    bad = [t for t, _, good in points if not good]
    if ok:
        ax.scatter([t for t, _ in ok], [v for _, v in ok], s=6, color="#2ca02c", label="B succeeded (E2E)")
    if bad:
        top = max([v for _, v in ok], default=1.0)
        ax.scatter(bad, [top * 1.05] * len(bad), s=14, marker="x", color="#d62728", label="B failed or refused")
    if gate_s is not None:
        ax.axhline(gate_s * 1e3, color="red", linestyle="--", linewidth=0.8, label="B P99 E2E gate (baseline + 25 %)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("B end-to-end latency (ms)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.suptitle(f"{title}\n{_device_label(device)}", fontsize=10)
    _save(fig, path)


__all__ = ["BarGroup", "plot_ab", "plot_pairs", "plot_timeline"]
