"""What a soak leaves on disk, so that even a soak that is killed still leaves its evidence.

In ``--report DIR``:

* ``events.ndjson`` – one JSON object per line, appended and flushed as things
  happen (cycle start, load with generation and golden + warm-up time, unload,
  per-chip memory after it, violations, checkpoints). Written with ``O_APPEND``
  line by line, so a killed process loses at most the line being written.
* ``soak-report.json`` – the report, rewritten atomically (temporary file +
  ``os.replace``) at every checkpoint (at least every minute by default) and at
  every cycle end with ``"status": "running"``, and at the end with the final
  status. A reader never sees a half-written file.
* ``soak.png`` – at the end: per-chip memory over time against the baseline and
  the drift limit, request latency over time per model, and the cycle markers.

:class:`Series` keeps time series bounded (a 24-hour soak would otherwise hold
millions of points): past ``max_points`` it keeps every other point and halves
its sampling rate. This module does not decide anything.
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calctl.runners.plotting import device_label, pyplot

EVENTS_FILE = "events.ndjson"
REPORT_FILE = "soak-report.json"
PLOT_FILE = "soak.png"


class EventLog:
    """Append-only NDJSON, thread-safe; each line ``{"t": s since start, "wall": iso, "event": name, ...}``."""

    def __init__(self, path: Path, t0: float) -> None:
        self.path = path
        self._t0 = t0
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lines = 0

    def write(self, event: str, **fields: Any) -> None:
        from calctl.records import dumps_line

        doc = {
            "t": round(time.monotonic() - self._t0, 4),
            "wall": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "event": event,
            **fields,
        }
        line = dumps_line(doc).encode()
        with self._lock:
            if self._fd < 0:
                return
            os.write(self._fd, line)
            self.lines += 1

    def sync(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1


class Series:
    """A bounded time series: (t, value) points, decimated by 2 whenever it outgrows ``max_points``."""

    def __init__(self, max_points: int = 4000) -> None:
        self.max_points = max_points
        self._points: list[tuple[float, float]] = []
        self._stride = 1
        self._seen = 0
        self._lock = threading.Lock()

    def add(self, t: float, value: float) -> None:
        with self._lock:
            self._seen += 1
            if (self._seen - 1) % self._stride:
                return
            self._points.append((t, value))
            if len(self._points) > self.max_points:
                self._points = self._points[::2]
                self._stride *= 2

    def points(self) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._points)


#: How a request that did not succeed is drawn in the latency panel, by class (calctl.runners.soak.wording).
_ENDED_STYLE = {
    "intended": {"marker": "+", "color": "#7f7f7f", "s": 14, "alpha": 0.7},
    "refused": {"marker": "x", "color": "#000000", "s": 16, "alpha": 0.8},
    "failed": {"marker": "X", "color": "#d62728", "s": 30, "alpha": 0.9},
}

#: How the after-unload drift checks are drawn: (within the limit?, marker, colour, size, legend label).
_CHECK_STYLE = (
    (True, "o", "green", 5, "after-unload check: within limit"),
    (False, "X", "red", 8, "after-unload check: over limit"),
)

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
_MIB = 1024.0**2
_ERROR_RED = "#d62728"

Spans = list[tuple[float, float]]


def soak_figure(
    *,
    memory: dict[int, Series],
    baseline: dict[int, int | None],
    limits: dict[int, int | None],
    latency: dict[str, Series],
    cycles: Sequence[tuple[float, float | None]],
    title: str,
    device: str,
    checks: dict[int, list[tuple[float, int | None]]] | None = None,
    interrupted: tuple[float, str] | None = None,
    ended: dict[str, Series] | None = None,
    counts: Mapping[str, int] | None = None,
    sent: int | None = None,
    error: str | None = None,
) -> Any:
    """Per-chip memory (MiB above baseline, one panel per chip) and request latency over time.

    Every request is in the latency panel: the successes by model, and the others (``ended``: outcome ->
    (time, seconds to its end)) by class, refused, failed or ended as the mix intends, each legend entry with
    its exact count (``counts``: the report's ``by_outcome``; the drawn points may be decimated), and the
    panel's title counts them all (``sent``). A soak that ended in an error (``error``) shows that text in
    the title and in every panel that has nothing to draw, never empty axes.

    Memory is drawn as the samples taken (a step from each sample to the next, a dot per sample), never
    as ramps between them. The drift limit is an after-unload check, so it is drawn where it applies:
    across the unloaded (grey) spans, with the measured drift of each check as a marker (``checks``: per
    chip, (time, drift bytes) of every after-unload check). ``cycles``: (loaded_at, unloaded_at) in seconds
    since the start; ``interrupted``: (time, signal) when SIGINT/SIGTERM ended the soak.
    """
    plt = pyplot()
    chips = sorted(memory) or [0]
    fig, axes = plt.subplots(
        len(chips) + 1, 1, figsize=(12, 2.6 * len(chips) + 3), sharex=True, height_ratios=[2] * len(chips) + [3]
    )
    mem_axes, ax_lat = list(axes[:-1]), axes[-1]
    spans = _unloaded_spans(memory, cycles, interrupted)
    for i, (chip, ax) in enumerate(zip(chips, mem_axes, strict=True)):
        series = memory.get(chip)
        _draw_memory(
            ax,
            chip,
            _PALETTE[i % len(_PALETTE)],
            series.points() if series is not None else [],
            baseline.get(chip),
            limits.get(chip),
            spans,
            (checks or {}).get(chip, []),
        )
    _draw_latency(ax_lat, latency, ended or {}, counts, sent, error)
    if error:
        for ax in mem_axes:
            if not ax.get_legend_handles_labels()[0]:
                _say_in_panel(ax, f"no memory sample:\n{_wrapped(error)}", color=_ERROR_RED, fontsize=10)
    _draw_cycles([*mem_axes, ax_lat], cycles, spans, interrupted)
    heading = f"{title}\n{device_label(device)}; green lines: loads (golden + warm-up passed), grey: unloaded"
    if error:
        heading += f"\nERROR: {_wrapped(error, 140)}"
    mem_axes[0].set_title(heading, fontsize=10, color=_ERROR_RED if error else "black")
    fig.tight_layout()
    return fig


def _unloaded_spans(
    memory: dict[int, Series], cycles: Sequence[tuple[float, float | None]], interrupted: tuple[float, str] | None
) -> Spans:
    """(from, to) of every time the package was unloaded: from an unload to the next load (or the end)."""
    end = max([t for s in memory.values() for t, _ in s.points()] + [c[1] or c[0] for c in cycles] + [0.0])
    if interrupted is not None:
        end = max(end, interrupted[0])
    spans: Spans = []
    for n, (_loaded, unloaded) in enumerate(cycles):
        nxt = cycles[n + 1][0] if n + 1 < len(cycles) else (end if unloaded is not None else None)
        if unloaded is not None and nxt is not None and nxt > unloaded:
            spans.append((unloaded, nxt))
    return spans


def _draw_memory(
    ax: Any,
    chip: int,
    colour: str,
    pts: list[tuple[float, float]],
    base: int | None,
    lim: int | None,
    spans: Spans,
    checks: list[tuple[float, int | None]],
) -> None:
    """One chip's panel: its samples above the baseline, the drift limit across the unloaded spans, the checks."""
    if pts and base is not None:
        xs, ys = [t for t, _ in pts], [(v - base) / _MIB for _, v in pts]
        ax.step(xs, ys, where="post", color=colour, linewidth=1.0, label=f"chip{chip} sampled")
        ax.plot(xs, ys, linestyle="none", marker=".", markersize=3, color=colour)
    if lim is not None:
        for k, (lo, hi) in enumerate(spans):
            label = f"drift limit after unload: {lim / _MIB:.0f} MiB" if k == 0 else None
            ax.hlines(lim / _MIB, lo, hi, color="red", linestyle="--", linewidth=1.0, label=label)
    done = [(t, d) for t, d in checks if d is not None]
    for within, marker, colour_, size, label in _CHECK_STYLE if done else ():
        marks = [(t, d) for t, d in done if (lim is None or abs(d) <= lim) is within]
        if marks:
            ax.plot(
                [t for t, _ in marks], [d / _MIB for _, d in marks], marker, color=colour_, markersize=size, label=label
            )
    ax.axhline(0.0, color="grey", linewidth=0.6)
    ax.set_ylabel(f"chip{chip}: MiB above\nbaseline")
    if ax.get_legend_handles_labels()[0]:  # nothing sampled (no load reached): no empty legend, no warning
        ax.legend(loc="upper left", fontsize=8)


def _draw_latency(
    ax: Any,
    latency: dict[str, Series],
    ended: dict[str, Series],
    counts: Mapping[str, int] | None,
    sent: int | None,
    error: str | None,
) -> None:
    """The latency panel: successes by model, the other ends by class with their exact counts, the title."""
    from calctl.runners.soak.wording import RequestCounts

    for i, (alias, series) in enumerate(sorted(latency.items())):
        pts = series.points()
        if pts:
            colour = _PALETTE[i % len(_PALETTE)]
            ax.scatter(*_ms(pts), s=3, alpha=0.5, color=colour, label=f"{alias} end-to-end")
    tally = RequestCounts.of(sent if sent is not None else sum((counts or {}).values()), counts or {})
    groups = {"intended": tally.intended, "refused": tally.refused, "failed": tally.failed}
    for group, outcomes in groups.items():
        pts = [p for outcome in sorted(outcomes) for p in ended.get(outcome, Series()).points()]
        if pts:
            words = "ended as the mix intends" if group == "intended" else group
            listed = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
            ax.scatter(*_ms(pts), label=f"{words}: {listed}", zorder=3, **_ENDED_STYLE[group])
    ax.set_ylabel("time to the request's end (ms)")
    ax.set_xlabel("time since the soak started (s)")
    if counts is not None or sent is not None:
        ax.set_title("\n".join(textwrap.wrap(f"requests: {tally.phrase()}", 150)), fontsize=9, loc="left")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8)
    else:
        text = "no request ended" + (f":\n{_wrapped(error)}" if error else "")
        _say_in_panel(ax, text, color=_ERROR_RED if error else "black", fontsize=11)


def _ms(pts: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """(times, milliseconds) of (time, seconds) points."""
    return [t for t, _ in pts], [v * 1e3 for _, v in pts]


def _say_in_panel(ax: Any, text: str, *, color: str, fontsize: int) -> None:
    """A panel with nothing to draw says why, in its middle, with no scale for nothing drawn."""
    ax.set_yticks([])
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color=color, fontsize=fontsize)


def _draw_cycles(
    axes: list[Any], cycles: Sequence[tuple[float, float | None]], spans: Spans, interrupted: tuple[float, str] | None
) -> None:
    """On every panel: a green line at each load, the unloaded spans in grey, the interrupt in magenta."""
    for loaded, _ in cycles:
        for ax in axes:
            ax.axvline(loaded, color="green", linewidth=0.5, alpha=0.6)
    for lo, hi in spans:
        for ax in axes:
            ax.axvspan(lo, hi, color="grey", alpha=0.12, linewidth=0)
    if interrupted is not None:
        for ax in axes:
            ax.axvline(interrupted[0], color="magenta", linewidth=1.5)
        axes[-1].annotate(
            f"INTERRUPTED ({interrupted[1]})",
            (interrupted[0], 1.0),
            xycoords=("data", "axes fraction"),
            ha="right",
            va="top",
            color="magenta",
            fontsize=9,
        )


def _wrapped(text: str, width: int = 90) -> str:
    return "\n".join(textwrap.wrap(text, width)[:6])


__all__ = [
    "EVENTS_FILE",
    "PLOT_FILE",
    "REPORT_FILE",
    "EventLog",
    "Series",
    "soak_figure",
]
