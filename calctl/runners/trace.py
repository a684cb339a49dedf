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

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calctl.records import atomic_output, write_atomic


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
    write_atomic(path, json.dumps(chrome_trace(slices, device=device, metadata=metadata), indent=1))


def plot_timeline(path: Path, slices: Iterable[TraceSlice], *, title: str, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    items = list(slices)
    t0 = min((s.start for s in items), default=0.0)
    models = sorted({s.model for s in items})
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    colour = {m: palette[i % len(palette)] for i, m in enumerate(models)}
    # One lane per chip, plus a pong lane for a chip that ran pong jobs (they overlap its ping jobs).
    lanes = sorted(
        {(s.chip, False) for s in items}
        | {(0, False), (1, False)}
        | {(s.chip, True) for s in items if s.engine == "pong"}
    )
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.9 * len(lanes)))
    phase_colour = {"h2d": "#bbbbbb", "compute": "#222222", "d2h": "#777777"}
    for s in items:
        y = lanes.index((s.chip, s.engine == "pong"))
        if s.phase is not None:  # a sub-slice: a thin bar inside its job's bar
            ax.barh(
                y,
                (s.end - s.start) * 1e3,
                left=(s.start - t0) * 1e3,
                height=0.25,
                color=phase_colour.get(s.phase, "#555555"),
                linewidth=0,
            )
            continue
        hatch = "//" if "prefill" in s.graph else None
        ax.barh(
            y,
            (s.end - s.start) * 1e3,
            left=(s.start - t0) * 1e3,
            height=0.6,
            color=colour[s.model],
            edgecolor="black" if not s.ok else colour[s.model],
            hatch=hatch,
            linewidth=0.3,
        )
    ax.set_yticks(range(len(lanes)), [f"chip{c} pong" if pong else f"chip{c}" for c, pong in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("time since first job (ms)")
    label = "MOCK device: simulated timing, not hardware evidence" if device == "mock" else f"device: {device}"
    ax.set_title(f"{title}\n{label}", fontsize=10)
    handles = [Patch(color=colour[m], label=m) for m in models]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="prefill"))
    for ph in sorted(
        {s.phase for s in items if s.phase is not None},
        key=lambda p: (p not in phase_colour, list(phase_colour).index(p) if p in phase_colour else 0, p),
    ):
        handles.append(Patch(color=phase_colour.get(ph, "#555555"), label=ph))
    # Outside the axes, so it never hides a job slice.
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
