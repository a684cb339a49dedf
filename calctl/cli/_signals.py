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
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from calctl.errors import Interrupted, note_signal

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    """One process-wide record: which signal arrived, how deep the contexts are, whether a run's measurement
    is over (its command is writing the report: a signal then waits for the write)."""

    fired: str | None = None
    deferred = False  # the first signal came while deferring: nothing raised, main still has to say so
    depth = 0
    deferring = False


def signal_fired() -> str | None:
    """The signal (``SIGINT``/``SIGTERM``) the current command's handler caught, if any."""
    return _State.fired


def signal_deferred() -> str | None:
    """The signal that arrived after the command's measurement and was deferred (nothing was raised), if any."""
    return _State.fired if _State.deferred else None


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While the body runs, the first SIGINT or SIGTERM raises :class:`Interrupted` (main thread only); every
    later one is ignored until the outermost context exits.

    Contexts nest: the outermost (``calctl.cli.app.main``) covers the whole command; a command that runs a
    measurement opens an inner one around it. Once an inner context has exited, the measurement is over and
    its command writes and prints the report: a first signal then is *deferred* (the report is written whole,
    with its verdict) and :func:`signal_deferred` tells ``main`` to exit 130 after it, saying so."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if _State.fired is not None:
            return  # already stopping: let the teardown finish
        _State.fired = signal.Signals(signum).name
        if _State.deferring:
            _State.deferred = True
        else:
            note_signal(_State.fired)  # kept: a raise inside a GC callback is dropped (errors.signal_unraised)
            raise Interrupted(_State.fired)

    outermost = _State.depth == 0
    previous = {s: signal.signal(s, handler) for s in _SIGNALS} if outermost else {}
    unraisable = sys.unraisablehook

    def quiet_unraisable(what: Any) -> None:
        # The handler's raise landed in a weakref callback or a __del__ the garbage collector ran, where Python
        # drops it with a traceback on stderr: the signal is recorded (errors.signal_unraised) and the run stops
        # at its next step, so the traceback would only alarm.
        if not isinstance(what.exc_value, Interrupted):
            unraisable(what)

    if outermost:
        _State.fired, _State.deferred, _State.deferring = None, False, False
        note_signal(None)
        sys.unraisablehook = quiet_unraisable
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if outermost:
            for s, h in previous.items():
                signal.signal(s, h)
            _State.deferring = False
            note_signal(None)  # a later command in this process starts with none
            sys.unraisablehook = unraisable
        else:
            _State.deferring = True  # the measurement is over: the report is written whole
