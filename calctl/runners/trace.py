"""Per-chip job traces: Chrome/Perfetto trace-event JSON and a timeline picture.

The JSON uses the Trace Event Format (``ph: "X"`` complete events, one process
per device, one thread per chip) so ``ui.perfetto.dev`` or ``chrome://tracing``
open it directly. A ``pong`` job gets its chip's second track ("chipN pong"),
because it may be in flight together with a ``ping`` job and slices on one
track must nest; a slice with a ``phase`` (h2d / compute / d2h) lies inside its
job's slice on the same track, so the viewer shows it as a sub-slice. The picture is a matplotlib timeline with one lane per chip
that a person can read at a glance: where both lanes are filled at the same
time, the chips overlapped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.records import atomic_output, dumps, write_atomic
from calctl.report import Report
from calctl.runners.plotting import device_label
from calctl.runtime import TraceEvent, intervals
from calctl.runtime.types import JobState


@dataclass(frozen=True)
class TraceSlice:
    chip: int
    start: float  # seconds, monotonic clock
    end: float
    model: str
    graph: str
    engine: str
    job_id: int
    generation: int | None
    ok: bool = True
    phase: str | None = None  # optional sub-phase (h2d / compute / d2h)


PONG_TRACK_OFFSET = 1000  # tid of chip N's pong track: 1000 + N


def _track(s: TraceSlice) -> int:
    return PONG_TRACK_OFFSET + s.chip if s.engine == "pong" else s.chip


def chrome_trace(
    slices: Sequence[TraceSlice], *, device: str, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    t0 = min((s.start for s in slices), default=0.0)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"calctl {device} device"}},
    ]
    for chip in sorted({s.chip for s in slices} | {0, 1}):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": chip, "args": {"name": f"chip{chip}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": chip, "args": {"sort_index": 2 * chip}})
    for chip in sorted({s.chip for s in slices if s.engine == "pong"}):
        tid = PONG_TRACK_OFFSET + chip
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": f"chip{chip} pong"}})
        events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid, "args": {"sort_index": 2 * chip + 1}}
        )
    # A job slice sorts before its phases (same start, longer), so viewers nest them.
    for s in sorted(slices, key=lambda s: (s.start, s.chip, s.phase is not None, -s.end)):
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": _track(s),
                "cat": "job" if s.phase is None else f"job.{s.phase}",
                "name": f"{s.graph}" if s.phase is None else f"{s.graph}:{s.phase}",
                "ts": round((s.start - t0) * 1e6, 3),
                "dur": round(max(0.0, s.end - s.start) * 1e6, 3),
                "args": {
                    "model": s.model,
                    "graph": s.graph,
                    "engine": s.engine,
                    "job_id": s.job_id,
                    "generation": s.generation,
                    "ok": s.ok,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"device": device, **(metadata or {})}}


def write_chrome_trace(
    path: Path, slices: Sequence[TraceSlice], *, device: str, metadata: dict[str, Any] | None = None
) -> None:
    write_atomic(path, dumps(chrome_trace(slices, device=device, metadata=metadata), versioned=False, indent=1))


@dataclass(frozen=True)
class Mark:
    """A labelled span of the run (a PoC round phase, a golden run), shaded behind the lanes."""

    label: str  # what ran: e.g. "golden model-a", "A alone", "B alone", "A+B joint"
    start: float  # seconds, the same monotonic clock as the slices
    end: float


def busy_overlap(slices: Sequence[TraceSlice], chips: tuple[int, int] = (0, 1)) -> list[tuple[float, float]]:
    """Intervals during which both ``chips`` had a job running (the PoC's "both chips computing")."""

    u0, u1 = (intervals.union((x.start, x.end) for x in slices if x.chip == c and x.phase is None) for c in chips)
    return intervals.intersections(u0, u1)


_MARK_COLOUR = {"golden": "#dddddd", "A alone": "#d6e6f5", "B alone": "#fde3cc", "A+B joint": "#d5f0d5"}


def _mark_kind(label: str) -> str:
    return "golden" if label.startswith("golden") else label


def plot_timeline(
    path: Path,
    slices: Iterable[TraceSlice],
    *,
    title: str,
    device: str,
    marks: Sequence[Mark] = (),
    chips: Sequence[int] | None = None,
    lane_names: dict[str, str] | None = None,
    notes: Sequence[str] = (),
    latency: bool = False,
    latency_iterations: int | None = None,
    telemetry: Sequence[TelemetryPoint] = (),
) -> None:
    """One lane per chip (and a pong lane where pong jobs ran), jobs coloured by model, prefill hatched.

    With both chips shown, a lane "both chips busy" draws the overlap itself, so concurrency reads as
    overlap and not as blocks taking turns; ``marks`` shade the phases of the run behind the lanes (the
    PoC's golden runs, A alone, B alone, A+B joint). ``chips``: the chips to draw (default: those that ran a
    job, and chips 0 and 1). A chip gets one lane per engine that ran there: ``ping`` (or ``auto``) is the
    chip's own lane, ``pong`` and any other engine label (e.g. a compared round) get their own; ``lane_names``
    maps an engine to its lane suffix, e.g. ``{"ping": " ping engine"}``. ``notes``: lines printed under the
    picture (the figures it illustrates, with their CIs). ``latency``: a second panel with every job's
    duration per graph on the device's clock (failed jobs in red), its P50 and P99 marked and its CV and n
    written beside it: the figures a warm-up's stability verdict rests on. ``telemetry``: each chip's
    temperature and power over the same time axis, in a panel under the lanes (beside the work that heated it).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    items = list(slices)
    layout = _LaneLayout.of(items, chips, lane_names)
    t0 = min([s.start for s in items] + [m.start for m in marks], default=0.0)
    models = sorted({s.model for s in items})
    colour = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)}
    jobs = [s for s in items if s.phase is None]
    graphs = sorted({s.graph for s in jobs}) if latency else []
    n_lanes = layout.count
    heights = [1.6 + 0.9 * n_lanes] + ([0.6 + 0.55 * len(graphs)] if graphs else []) + ([2.2] if telemetry else [])
    if len(heights) > 1:
        fig, axes = plt.subplots(
            len(heights), 1, figsize=(12, sum(heights) + 0.6), gridspec_kw={"height_ratios": heights}
        )
        ax = axes[0]
        if graphs:
            _latency_panel(axes[1], jobs, graphs, colour, latency_iterations)
    else:
        fig, ax = plt.subplots(figsize=(12, 1.6 + 0.9 * n_lanes))
    for m in marks:  # behind everything
        colour_of_mark = _MARK_COLOUR.get(_mark_kind(m.label), "#eeeeee")
        ax.axvspan((m.start - t0) * 1e3, (m.end - t0) * 1e3, color=colour_of_mark, alpha=0.8, linewidth=0, zorder=0)
    _draw_jobs(ax, items, layout, t0, colour)
    if layout.overlap:
        _draw_overlap(ax, items, len(layout.lanes), t0)
    ax.set_yticks(range(n_lanes), layout.labels())
    ax.set_ylim(n_lanes - 0.4, -0.6)  # top to bottom, the last lane clear of the axis line
    ax.set_xlabel("time since the first job (ms)")
    ax.set_title(f"{title}\n{device_label(device)}", fontsize=10)
    # Outside the axes, so it never hides a job slice.
    handles = _legend(items, models, colour, layout.overlap, marks)
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    if telemetry:
        _telemetry_panel(axes[-1], telemetry, t0, ax.get_xlim())
    if notes:
        fig.text(0.01, 0.0, "\n".join(notes), ha="left", va="top", fontsize=8, family="monospace")
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)


_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
_PHASE_COLOUR = {"h2d": "#bbbbbb", "compute": "#222222", "d2h": "#777777"}
_OVERLAP_COLOUR = "#2e7d32"


def _lane_of(s: TraceSlice) -> str:
    return "" if s.engine in ("ping", "auto", "") else s.engine


def _lane_order(key: tuple[int, str]) -> tuple[int, int, str]:
    chip, lane = key
    return (chip, 0 if lane == "" else 1 if lane == "pong" else 2, lane)


@dataclass(frozen=True)
class _LaneLayout:
    """The timeline's lanes, top to bottom: one a chip, one more for each other engine that ran there (pong, a
    compared round), and "both chips busy" under them when chips 0 and 1 are both shown."""

    shown: tuple[int, ...]
    lanes: tuple[tuple[int, str], ...]
    names: dict[str, str]
    overlap: bool

    @classmethod
    def of(
        cls, items: Sequence[TraceSlice], chips: Sequence[int] | None, lane_names: dict[str, str] | None
    ) -> _LaneLayout:
        names = {
            "": "",
            "pong": " pong",
            **{("" if k in ("ping", "auto") else k): v for k, v in (lane_names or {}).items()},
        }
        shown = sorted(set(chips) if chips is not None else {s.chip for s in items} | {0, 1})
        lanes = sorted(
            {(c, "") for c in shown} | {(s.chip, _lane_of(s)) for s in items if s.chip in shown}, key=_lane_order
        )
        return cls(tuple(shown), tuple(lanes), names, 0 in shown and 1 in shown)

    @property
    def count(self) -> int:
        return len(self.lanes) + (1 if self.overlap else 0)

    def labels(self) -> list[str]:
        labels = [f"chip{c}{self.names.get(lane, f' {lane}')}" for c, lane in self.lanes]
        return labels + (["both chips busy"] if self.overlap else [])


def _draw_jobs(ax: Any, items: Sequence[TraceSlice], layout: _LaneLayout, t0: float, colour: dict[str, str]) -> None:
    """Each job a bar in its lane (prefill hatched, a failed one outlined red); a phase a thin bar inside it."""
    for s in items:
        if s.chip not in layout.shown:
            continue
        y = layout.lanes.index((s.chip, _lane_of(s)))
        left, width = (s.start - t0) * 1e3, (s.end - s.start) * 1e3
        if s.phase is not None:  # a sub-slice: a thin bar inside its job's bar
            phase = _PHASE_COLOUR.get(s.phase, "#555555")
            ax.barh(y, width, left=left, height=0.25, color=phase, linewidth=0, zorder=3)
            continue
        ax.barh(y, width, left=left, height=0.6, color=colour[s.model], linewidth=0, zorder=2)
        if "prefill" in s.graph:  # the hatch in white over the job's colour: visible on any fill
            ax.barh(y, width, left=left, height=0.6, fill=False, hatch="///", edgecolor="white", linewidth=0, zorder=2)
        if not s.ok:
            ax.barh(y, width, left=left, height=0.6, fill=False, edgecolor="red", linewidth=1.2, zorder=4)


def _draw_overlap(ax: Any, items: Sequence[TraceSlice], y: int, t0: float) -> None:
    """The lane "both chips busy": the overlap itself, so concurrency reads as overlap, not blocks taking turns."""
    both = busy_overlap(items)
    for a, b in both:
        ax.barh(y, (b - a) * 1e3, left=(a - t0) * 1e3, height=0.6, color=_OVERLAP_COLOUR, linewidth=0, zorder=2)
    if not both:  # an empty lane says so: it is a finding (the chips never computed together), not a gap
        text = "none: the chips never computed at the same time"
        style: dict[str, Any] = {"va": "center", "ha": "left", "fontsize": 9, "style": "italic"}
        ax.text(0.01, y, text, transform=ax.get_yaxis_transform(), color=_OVERLAP_COLOUR, **style)


def _legend(
    items: Sequence[TraceSlice], models: Sequence[str], colour: dict[str, str], overlap: bool, marks: Sequence[Mark]
) -> list[Any]:
    from matplotlib.patches import Patch

    handles = [Patch(color=colour[m], label=m) for m in models]
    handles.append(Patch(facecolor="#777777", edgecolor="white", hatch="///", label="prefill (hatched)"))
    if any(not s.ok for s in items):
        handles.append(Patch(facecolor="white", edgecolor="red", label="failed job"))
    if overlap:
        handles.append(Patch(color=_OVERLAP_COLOUR, label="both chips busy"))
    for kind in dict.fromkeys(_mark_kind(m.label) for m in marks):
        handles.append(Patch(color=_MARK_COLOUR.get(kind, "#eeeeee"), label=f"phase: {kind}"))
    phases = sorted(
        {s.phase for s in items if s.phase is not None},
        key=lambda p: (p not in _PHASE_COLOUR, list(_PHASE_COLOUR).index(p) if p in _PHASE_COLOUR else 0, p),
    )
    handles.extend(Patch(color=_PHASE_COLOUR.get(ph, "#555555"), label=ph) for ph in phases)
    return handles


#: One telemetry sample of one chip: (monotonic seconds, chip, temperature °C or None, power W or None).
TelemetryPoint = tuple[float, int, float | None, float | None]


def _telemetry_panel(ax: Any, points: Sequence[TelemetryPoint], t0: float, xlim: tuple[float, float]) -> None:
    """Temperature (solid, left axis) and power (dashed, right axis) per chip on the lanes' time axis."""
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    power_ax = ax.twinx()
    drawn = False
    for i, chip in enumerate(sorted({p[1] for p in points})):
        colour = palette[i % len(palette)]
        mine = [p for p in points if p[1] == chip]
        temps = [((t - t0) * 1e3, v) for t, _, v, _ in mine if v is not None]
        watts = [((t - t0) * 1e3, w) for t, _, _, w in mine if w is not None]
        if temps:
            ax.plot([x for x, _ in temps], [y for _, y in temps], color=colour, marker=".", label=f"chip{chip} °C")
            drawn = True
        if watts:
            power_ax.plot([x for x, _ in watts], [y for _, y in watts], color=colour, linestyle="--", marker=".")
            drawn = True
    ax.set_xlim(xlim)
    ax.set_ylabel("temperature (°C), solid")
    power_ax.set_ylabel("power (W), dashed")
    ax.set_xlabel("time since the first job (ms); chip telemetry sampled through the run")
    if drawn:
        ax.legend(loc="upper left", fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "telemetry: not reported by the runtime", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)


def _warm(rows: list[TraceSlice], iterations: int | None) -> list[TraceSlice]:
    """The jobs after the first of ``iterations`` iterations (the cold one, left out of warm-up's figures)."""
    if not iterations or iterations < 2 or len(rows) % iterations:
        return rows
    return sorted(rows, key=lambda s: s.start)[len(rows) // iterations :]


def _latency_panel(
    ax: Any, jobs: Sequence[TraceSlice], graphs: Sequence[str], colour: dict[str, str], iterations: int | None = None
) -> None:
    """Each graph's job durations (ms, device clock) as points on one row, P50 and the tail (P99 from 100 jobs,
    else the max: calctl.checks.stats) as ticks, CV and n: the figures of warm-up's table, from the same jobs
    (``iterations``: the first, cold, iteration is left out as there)."""
    import numpy as np

    from calctl.checks.stats import tail_of

    for y, graph in enumerate(graphs):
        rows = _warm([s for s in jobs if s.graph == graph], iterations)
        ms = np.array([(s.end - s.start) * 1e3 for s in rows])
        ok = np.array([s.ok for s in rows])
        jitter = (np.arange(len(ms)) % 7 - 3) * 0.04
        ax.scatter(ms[ok], y + jitter[ok], s=12, color=colour[rows[0].model], alpha=0.7, linewidths=0, zorder=3)
        if (~ok).any():
            ax.scatter(ms[~ok], y + jitter[~ok], s=24, color="red", marker="x", zorder=4)
        p50 = float(np.percentile(ms, 50))
        word, tail = tail_of(ms.tolist())
        p99 = float(tail if tail is not None else p50)
        cv = float(ms.std(ddof=1) / ms.mean()) if len(ms) > 1 and ms.mean() > 0 else 0.0
        for value, name in ((p50, "P50"), (p99, "P99")):
            ax.plot([value, value], [y - 0.32, y + 0.32], color="black", linewidth=1.4 if name == "P99" else 1.0)
        ax.text(
            1.005,
            y,
            f"P50 {p50:.2f} ms  {word} {p99:.2f} ms  CV {cv:.3f}  n={len(ms)}"
            + (f"  failed {int((~ok).sum())}" if (~ok).any() else ""),
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize=8,
            family="monospace",
        )
    ax.set_yticks(range(len(graphs)), list(graphs))
    ax.set_ylim(len(graphs) - 0.5, -0.5)
    ax.set_xlim(left=0)
    cold = "; first iteration left out" if iterations and iterations > 1 else ""
    ax.set_xlabel(
        f"job duration on the device's clock (ms); ticks: P50 (thin) and P99 or max (thick); red x: failed job{cold}"
    )
    ax.grid(axis="x", alpha=0.3)


def trace_slices(events: Sequence[TraceEvent], *, phases: bool = False) -> list[TraceSlice]:
    """Chrome-trace slices of the jobs that ran (a job aborted before it started has no interval).

    ``phases``: add each job's h2d/compute/d2h intervals as sub-slices where the runtime reports them.
    """
    out: list[TraceSlice] = []
    for e in events:
        if e.start_ns is None or e.end_ns is None:
            continue
        job = TraceSlice(
            chip=e.chip,
            start=e.start_ns / 1e9,
            end=e.end_ns / 1e9,
            model=e.model,
            graph=e.graph,
            engine=e.engine.value,
            job_id=int(e.job),
            generation=int(e.generation),
            ok=e.state is JobState.SUCCEEDED,
        )
        out.append(job)
        if phases and e.phases:
            out.extend(
                dataclasses.replace(job, start=p.start_ns / 1e9, end=p.end_ns / 1e9, phase=p.phase.value)
                for p in e.phases
            )
    return out


def write_trace_outputs(
    events: Sequence[TraceEvent],
    *,
    trace: Path | None,
    plot: Path | None,
    device: str,
    title: str,
    metadata: dict[str, Any],
    marks: Sequence[Mark] = (),
    latency: bool = False,
    latency_iterations: int | None = None,
    telemetry: Sequence[TelemetryPoint] = (),
) -> dict[str, str | None]:
    """Write the Chrome/Perfetto JSON and/or the timeline PNG (``marks`` shaded behind it, ``latency``: the
    per-graph duration panel of :func:`plot_timeline`); return where they went."""
    slices = trace_slices(events)
    out: dict[str, str | None] = {"json": None, "plot": None}
    if trace is not None:
        write_chrome_trace(trace, slices, device=device, metadata=metadata)
        out["json"] = str(trace)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_timeline(
            plot,
            slices,
            title=title,
            device=device,
            marks=marks,
            latency=latency,
            latency_iterations=latency_iterations,
            telemetry=telemetry,
        )
        out["plot"] = str(plot)
    return out


def warm_iterations(report: Report) -> int | None:
    """Iterations of every model of a warm-up report (its picture leaves out the first, cold one, as its table
    does); None for another report or when the models ran different counts."""
    if report.command != "warmup":
        return None
    counts = {getattr(r, "iterations", None) for r in report.body.get("models", [])}
    only = counts.pop() if len(counts) == 1 else None
    return only if isinstance(only, int) else None
