"""SIGTERM while ``calctl serve`` loads its package unwinds the load like Ctrl-C, even when Python dropped the
handler's raise (it landed in a ``__del__`` or weakref callback the garbage collector ran)."""

from __future__ import annotations

import os
import signal

import pytest

from calctl.errors import Interrupted, signal_unraised
from calctl.serving.launch import _sigterm_interrupts


class _SignalledInDel:
    """Sends SIGTERM from its ``__del__``: the handler runs there and its raise is dropped ("Exception ignored")."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # the handler runs at the next bytecode boundary, inside this __del__
            pass


def test_a_sigterm_whose_raise_was_dropped_still_unwinds_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    dropped: list[BaseException | None] = []
    monkeypatch.setattr("sys.unraisablehook", lambda what: dropped.append(what.exc_value))
    went_on = False
    with pytest.raises(Interrupted, match="SIGTERM"), _sigterm_interrupts():
        obj = _SignalledInDel()
        del obj
        went_on = True  # the load went on: nothing was raised here
    assert went_on and len(dropped) == 1 and isinstance(dropped[0], Interrupted)
    assert signal_unraised() is None  # forgotten once said: a later load in this process starts clean
    assert signal.getsignal(signal.SIGTERM) is not None


def test_a_second_sigterm_while_unwinding_is_ignored() -> None:
    released = False
    with pytest.raises(Interrupted), _sigterm_interrupts():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the teardown of the first is not cut short
            for _ in range(1000):
                pass
            released = True
    assert released
