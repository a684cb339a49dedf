"""uvicorn for ``calctl serve``: drain the engine before the listening socket closes (000 §12, 001 §11.1).

Behind a load balancer a serve process must leave without failing a request it
accepted. On the first SIGTERM or SIGINT:

1. the engine stops admission at once: ``/health/ready`` answers 503, a new
   request gets 503 with ``Retry-After`` (it was never accepted, so a balancer
   may send it to another board), ``/health/live`` stays 200;
2. the listener stays open and accepted requests keep running and streaming
   until the engine has none live, for at least ``drain_grace_s`` (time for a
   balancer that polls readiness to notice) and at most ``drain_timeout_s``;
3. only then does uvicorn close the listener and wait, within what is left of
   the budget, for the responses still being written.

A second signal stops waiting. Unlike ``uvicorn.Server``, the signal is not
raised again after shutdown: a drained stop is the normal end of the process
(exit 0), and the caller still has the board to release.

This module knows the engine only as :class:`Drainable`; it does not release
the device (``DeviceSupervisor.shutdown`` does) and picks no exit code.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

import uvicorn

log = logging.getLogger("calctl.serve")

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# Responses already complete in the engine still need a moment to be written out after the listener closes.
MIN_FLUSH_S = 0.5


class Drainable(Protocol):
    def start_draining(self) -> None:
        """Stop admission: readiness 503, new requests 503 with Retry-After."""
        ...

    def drained(self) -> bool:
        """No accepted request is live."""
        ...


@dataclass(frozen=True)
class DrainOutcome:
    """How the server stopped. ``signal`` is None when it stopped for another reason (e.g. a failed bind)."""

    signal: str | None
    drained: bool  # every accepted request had finished in the engine when the listener closed
    forced: bool  # a second signal cut the wait short
    seconds: float  # first signal -> listener closing


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` whose SIGTERM/SIGINT drains the engine first (see the module docstring)."""

    def __init__(
        self,
        config: uvicorn.Config,
        engine: Drainable,
        *,
        drain_timeout_s: float,
        drain_grace_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(config)
        self.engine = engine
        self.drain_timeout_s = drain_timeout_s
        self.drain_grace_s = min(drain_grace_s, drain_timeout_s)
        self._clock = clock
        self._signal: int | None = None
        self._started_at: float | None = None
        self._closed_at: float | None = None
        self._drained_at_close = False
        self._announced = False
        self._forced = False

    # -- signals -------------------------------------------------------------------------

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach only the main thread; an embedding caller drains by calling begin_drain()
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in DRAIN_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes of the event loop: set flags only, log from on_tick.
        if self._started_at is None:
            self.begin_drain(sig)
        else:
            self._forced = True
            self.force_exit = True
            self.should_exit = True

    def begin_drain(self, sig: int = signal.SIGTERM) -> None:
        """Stop admission now and close the listener once the engine has drained (idempotent)."""
        if self._started_at is not None:
            return
        self._signal = sig
        self._started_at = self._clock()
        self.engine.start_draining()

    # -- the wait, one check per uvicorn tick (100 ms) -------------------------------------

    async def on_tick(self, counter: int) -> bool:
        if self._started_at is not None and not self.should_exit:
            self._check_drain()
        if self.should_exit and self._closed_at is None:
            self._closed_at = self._clock()
            self._drained_at_close = self.engine.drained()
        return await super().on_tick(counter)

    def _check_drain(self) -> None:
        assert self._started_at is not None
        elapsed = self._clock() - self._started_at
        if not self._announced:
            self._announced = True
            log.info(
                "%s: draining (readiness 503, new requests 503 + Retry-After); deadline %.1f s, grace %.1f s",
                signal.Signals(self._signal or signal.SIGTERM).name,
                self.drain_timeout_s,
                self.drain_grace_s,
            )
        drained = self.engine.drained()
        if (drained and elapsed >= self.drain_grace_s) or elapsed >= self.drain_timeout_s:
            if not drained:
                log.warning(
                    "drain deadline of %.1f s reached with requests still live; closing anyway", self.drain_timeout_s
                )
            # uvicorn's own graceful wait (responses still being written) gets what is left of the budget.
            self.config.timeout_graceful_shutdown = max(self.drain_timeout_s - elapsed, MIN_FLUSH_S)  # type: ignore[assignment]
            self.should_exit = True

    # -- after run() ------------------------------------------------------------------------

    def remaining_s(self) -> float:
        """What is left of the drain budget now (the whole budget when no signal came)."""
        if self._started_at is None:
            return self.drain_timeout_s
        return max(0.0, self.drain_timeout_s - (self._clock() - self._started_at))

    def outcome(self) -> DrainOutcome:
        if self._started_at is None:
            return DrainOutcome(None, self.engine.drained(), False, 0.0)
        if self._closed_at is None:  # stopped before a tick noticed (e.g. the app failed): judge now
            self._closed_at, self._drained_at_close = self._clock(), self.engine.drained()
        return DrainOutcome(
            signal.Signals(self._signal or signal.SIGTERM).name,
            self._drained_at_close,
            self._forced,
            self._closed_at - self._started_at,
        )


__all__ = ["DRAIN_SIGNALS", "DrainOutcome", "Drainable", "DrainingServer"]
