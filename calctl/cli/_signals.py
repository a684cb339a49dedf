"""SIGINT and SIGTERM handled alike while a long command runs (soak, bench, bringup, the runners).

``timeout``, CI cancellation and systemd send SIGTERM; Python's default for it
is to die on the spot, leaving no summary, no picture and a report stuck at
"running". :func:`interruptible` installs calctl's own handler for both
signals, so the first one raises :class:`~calctl.errors.Interrupted` (a
``KeyboardInterrupt``) in the main thread and every teardown path runs: the
run ends INTERRUPTED, exit 130, with its evidence closed. The handler is
installed explicitly because a shell starts background jobs with SIGINT
ignored, and Python then installs none. A second signal while the first is
being handled is ignored, so the teardown finishes (SIGKILL still kills).
Nothing here knows what a command does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from calctl.errors import Interrupted

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt ``exc`` was raised while unwinding from, if any (its ``__context__`` chain).

    A cleanup step that fails during the teardown of an interrupt (a stream posting into a loop that
    is already closed) is part of the interrupt, not a new failure: the run still ended INTERRUPTED.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__context__
    return None


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While the body runs, SIGINT and SIGTERM raise :class:`Interrupted` once (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if fired:
            return  # already stopping: let the teardown finish
        fired.append(signal.Signals(signum).name)
        raise Interrupted(fired[0])

    previous = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
