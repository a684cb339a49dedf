"""Progress of long work (soak, burn-in, ...), readable at 80 columns and in a log.

On a terminal: a bar line that fits 80 columns (what, bar, counts, elapsed, ETA) and, under it, the live
counters as a sentence that wraps at the terminal's width instead of being cut (#53 item 5: at 100–120
columns the soak's one line was cut to `` 2 … traffic | gen 3 | …``). In a log or a pipe (stderr not a
terminal): one plain line per completed unit (a cycle) and at least one a minute, each with its counts and
ETA, so ``--hours 24`` under ``nohup`` or CI shows it is alive.

What this module does not do: know what the work is. A command gives the unit's name, the total (units or
seconds) and, at every update, the units done and a live sentence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.markup import escape

from calctl.cli import _output

#: In a log, at most this long between two progress lines (one per completed unit otherwise).
LOG_INTERVAL_S = 60.0
#: The bar's width: with its label, counts, elapsed time and ETA it fits 80 columns.
BAR_WIDTH = 24


def clock(seconds: float | None) -> str:
    """``1:02:03`` (or ``-:--:--`` when unknown)."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "-:--:--"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass(frozen=True)
class Plan:
    """What a long run will do: ``total`` units (cycles) or, when ``units`` is None, ``total`` seconds."""

    what: str
    total: float
    units: str | None = "cycles"

    def eta(self, done: float, elapsed_s: float) -> float | None:
        """Seconds left: by the measured rate of the units done so far, or the time left of a timed run."""
        if self.units is None:
            return max(0.0, self.total - elapsed_s)
        if done <= 0:
            return None
        return max(0.0, (self.total - done) * elapsed_s / done)

    def counts(self, done: float) -> str:
        if self.units is None:
            return f"{clock(min(done, self.total))}/{clock(self.total)}"
        return f"{int(done)}/{int(self.total)} {self.units}"


class LongProgress:
    """The progress of one long run on stderr (a context manager); :meth:`update` as often as the work likes."""

    def __init__(self, plan: Plan, *, now: Callable[[], float] = time.monotonic, is_terminal: bool | None = None):
        self.plan = plan
        self._now = now
        self._start = now()
        self._terminal = _output.stderr.is_terminal if is_terminal is None else is_terminal
        self._last_line_at = self._start
        self._last_done = 0.0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> LongProgress:
        if self._terminal:
            self._progress = _two_line_progress(self.plan)
            self._task = self._progress.add_task(self.plan.what, total=self.plan.total, counts="", live="starting")
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, done: float, live: str, *, elapsed_s: float | None = None) -> None:
        """``done`` units (or seconds of a timed run) so far, and the live counters in words."""
        elapsed = self._now() - self._start if elapsed_s is None else elapsed_s
        completed = elapsed if self.plan.units is None else done
        if self._progress is not None:
            counts = self.plan.counts(completed)
            self._progress.update(self._task, completed=min(completed, self.plan.total), counts=counts, live=live)
            return
        now = self._now()
        if done > self._last_done or now - self._last_line_at >= LOG_INTERVAL_S:
            self._last_done, self._last_line_at = max(done, self._last_done), now
            _output.info(escape(self.line(completed, live, elapsed)))

    def line(self, completed: float, live: str, elapsed_s: float) -> str:
        """One plain log line: ``soak 3/100 cycles, 0:01:23 elapsed, ETA 0:40:00 | LIVE``."""
        eta = self.plan.eta(completed, elapsed_s)
        return f"{self.plan.what} {self.plan.counts(completed)}, {clock(elapsed_s)} elapsed, ETA {clock(eta)} | {live}"


class Heartbeat:
    """Work whose stages calctl cannot count (an import's reading, converting and golden forward pass): on a
    terminal a spinner with the elapsed time, in a log a line every :data:`LOG_INTERVAL_S`, so it is never silent
    for minutes (#53 item 5: ``import gguf`` printed nothing for 1–3 minutes)."""

    def __init__(self, what: str, *, interval_s: float = LOG_INTERVAL_S, is_terminal: bool | None = None) -> None:
        import threading

        self.what = what
        self._interval = interval_s
        self._terminal = _output.stderr.is_terminal if is_terminal is None else is_terminal
        self._stop = threading.Event()
        self._thread: Any = None
        self._status: Any = None
        self._start = time.monotonic()

    def __enter__(self) -> Heartbeat:
        import threading

        self._start = time.monotonic()
        if self._terminal:
            self._status = _output.stderr.status(escape(self.what), spinner="dots")
            self._status.__enter__()
        self._thread = threading.Thread(target=self._beat, name="calctl-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._status is not None:
            self._status.__exit__(None, None, None)

    def _beat(self) -> None:
        step = 1.0 if self._terminal else self._interval
        while not self._stop.wait(step):
            line = f"{self.what}: still working, {clock(time.monotonic() - self._start)} elapsed"
            if self._status is not None:
                self._status.update(escape(line))
            else:
                _output.info(escape(line))


def _two_line_progress(plan: Plan) -> Any:
    """A rich Progress whose bar line fits 80 columns and whose live sentence wraps on a line of its own."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    class _Progress(Progress):
        def get_renderables(self) -> Iterable[Any]:
            yield self.make_tasks_table(self.tasks)
            for task in self.tasks:
                yield Text("  " + str(task.fields.get("live", "")), style="dim", overflow="fold")

    return _Progress(
        TextColumn(f"[bold]{escape(plan.what)}[/]"),
        BarColumn(bar_width=BAR_WIDTH),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=_output.stderr,
        transient=False,
        refresh_per_second=4,
    )


__all__ = ["LOG_INTERVAL_S", "Heartbeat", "LongProgress", "Plan", "clock"]
