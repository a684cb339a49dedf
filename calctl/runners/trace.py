"""Per-chip job traces: Chrome/Perfetto trace-event JSON and a timeline picture.

The JSON uses the Trace Event Format (``ph: "X"`` complete events, one process
per device, one thread per chip) so ``ui.perfetto.dev`` or ``chrome://tracing``
open it directly. The picture is a matplotlib timeline with one lane per chip
that a person can read at a glance: where both lanes are filled at the same
time, the chips overlapped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence


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


def chrome_trace(slices: Sequence[TraceSlice], *, device: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    t0 = min((s.start for s in slices), default=0.0)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"calctl {device} device"}},
    ]
    for chip in sorted({s.chip for s in slices} | {0, 1}):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": chip, "args": {"name": f"chip{chip}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": chip, "args": {"sort_index": chip}})
    for s in sorted(slices, key=lambda s: (s.start, s.chip)):
        events.append({
            "ph": "X", "pid": 1, "tid": s.chip, "cat": "job" if s.phase is None else f"job.{s.phase}",
            "name": f"{s.graph}" if s.phase is None else f"{s.graph}:{s.phase}",
            "ts": round((s.start - t0) * 1e6, 3), "dur": round(max(0.0, s.end - s.start) * 1e6, 3),
            "args": {"model": s.model, "graph": s.graph, "engine": s.engine, "job_id": s.job_id,
                     "generation": s.generation, "ok": s.ok},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"device": device, **(metadata or {})}}


def write_chrome_trace(path: Path, slices: Sequence[TraceSlice], *, device: str, metadata: dict[str, Any] | None = None) -> None:
    _atomic_write_text(path, json.dumps(chrome_trace(slices, device=device, metadata=metadata), indent=1))


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
    chips = sorted({s.chip for s in items} | {0, 1})
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.9 * len(chips)))
    for s in items:
        y = chips.index(s.chip)
        hatch = "//" if "prefill" in s.graph else None
        ax.barh(y, (s.end - s.start) * 1e3, left=(s.start - t0) * 1e3, height=0.6, color=colour[s.model],
                edgecolor="black" if not s.ok else colour[s.model], hatch=hatch, linewidth=0.3)
    ax.set_yticks(range(len(chips)), [f"chip{c}" for c in chips])
    ax.invert_yaxis()
    ax.set_xlabel("time since first job (ms)")
    label = "MOCK device: simulated timing, not hardware evidence" if device == "mock" else f"device: {device}"
    ax.set_title(f"{title}\n{label}", fontsize=10)
    handles = [Patch(color=colour[m], label=m) for m in models]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="prefill"))
    # Outside the axes, so it never hides a job slice.
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
