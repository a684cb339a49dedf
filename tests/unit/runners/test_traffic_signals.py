"""A signal that lands while an event loop is being built waits until it is built (issue 26: a SIGTERM inside the
loop's constructor left a half-built loop whose finaliser printed a traceback)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from calctl.loadgen.client import signals_held
from calctl.runners.traffic import EngineLoop


@pytest.fixture(autouse=True)
def _python_sigint_handler() -> Iterator[None]:
    """Python's own SIGINT handler for the test: a pytest-xdist worker, or a test before this one, may have left
    SIGINT ignored, and then a re-raised SIGINT is (rightly) ignored too."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_signal_inside_the_hold_is_raised_once_after_it() -> None:
    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            signal.raise_signal(signal.SIGINT)
            reached_end = True  # the body ran on: the handler did not run in the middle of it
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's handler is back


def test_engine_loop_built_under_a_signal_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    real = asyncio.new_event_loop
    built: list[asyncio.AbstractEventLoop] = []

    def interrupted_constructor() -> asyncio.AbstractEventLoop:
        signal.raise_signal(signal.SIGINT)  # SIGINT arrives inside the loop's constructor ...
        built.append(real())  # ... which still finishes: the signal waits for the hold to end
        return built[-1]

    monkeypatch.setattr("calctl.runners.traffic.asyncio.new_event_loop", interrupted_constructor)
    with pytest.raises(KeyboardInterrupt):
        EngineLoop()
    assert len(built) == 1
    built[0].close()
    monkeypatch.undo()
    with EngineLoop() as el:
        assert el.call(lambda: 41 + 1) == 42
