"""DrainingServer's decisions, tick by tick, with a fake engine and a fake clock (issue 11).

The process-level behaviour (signals, sockets, exit codes) is in
tests/integration/test_serve_signals.py; this checks when the server decides to
close, and what it reports, without a socket.
"""

from __future__ import annotations

import asyncio
import signal

import uvicorn

from calctl.serving.api.server import MIN_FLUSH_S, DrainingServer


class FakeEngine:
    def __init__(self) -> None:
        self.draining = False
        self.live = 0

    def start_draining(self) -> None:
        self.draining = True

    def drained(self) -> bool:
        return self.live == 0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _server(engine: FakeEngine, clock: Clock, *, timeout: float = 10.0, grace: float = 0.0) -> DrainingServer:
    async def app(scope, receive, send):
        raise AssertionError("no request in these tests")

    return DrainingServer(
        uvicorn.Config(app, timeout_graceful_shutdown=30),
        engine,
        drain_timeout_s=timeout,
        drain_grace_s=grace,
        clock=clock,
    )


def _tick(server: DrainingServer) -> bool:
    return asyncio.run(server.on_tick(1))


def test_no_signal_no_drain() -> None:
    engine, clock = FakeEngine(), Clock()
    server = _server(engine, clock)
    assert _tick(server) is False and not engine.draining
    assert server.outcome().signal is None and server.remaining_s() == 10.0


def test_sigterm_stops_admission_at_once_and_closes_when_the_last_request_ends() -> None:
    engine, clock = FakeEngine(), Clock()
    engine.live = 2
    server = _server(engine, clock)
    server.handle_exit(signal.SIGTERM, None)
    assert engine.draining and not server.should_exit  # readiness 503 now; the socket stays open
    clock.now += 3
    assert _tick(server) is False
    engine.live = 0
    clock.now += 1
    assert _tick(server) is True
    assert server.config.timeout_graceful_shutdown == 6.0  # the rest of the 10 s budget for writing out responses
    out = server.outcome()
    assert (out.signal, out.drained, out.forced, out.seconds) == ("SIGTERM", True, False, 4.0)


def test_grace_keeps_the_socket_open_even_when_idle() -> None:
    engine, clock = FakeEngine(), Clock()
    server = _server(engine, clock, grace=2.0)
    server.handle_exit(signal.SIGINT, None)
    clock.now += 1.9
    assert _tick(server) is False
    clock.now += 0.2
    assert _tick(server) is True and server.outcome().signal == "SIGINT"


def test_deadline_closes_with_requests_live_and_says_so() -> None:
    engine, clock = FakeEngine(), Clock()
    engine.live = 1
    server = _server(engine, clock, timeout=5.0)
    server.handle_exit(signal.SIGTERM, None)
    clock.now += 5.0
    assert _tick(server) is True
    assert server.config.timeout_graceful_shutdown == MIN_FLUSH_S
    assert server.remaining_s() == 0.0
    out = server.outcome()
    assert (out.drained, out.forced) == (False, False)


def test_second_signal_forces_exit() -> None:
    engine, clock = FakeEngine(), Clock()
    engine.live = 1
    server = _server(engine, clock)
    server.handle_exit(signal.SIGTERM, None)
    clock.now += 0.5
    assert _tick(server) is False
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and server.force_exit
    assert _tick(server) is True
    out = server.outcome()
    assert (out.drained, out.forced, out.seconds) == (False, True, 0.5)
