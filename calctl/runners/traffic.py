"""The in-process client of ``calctl soak`` and ``calctl bench``: requests driven through the serving engine.

Both tools measure the same things about a request (when it was sent, when the
first token arrived, every later token, how it ended), over two transports:

* the serving engine in-process (soak, the bench's fault-isolation scenario):
  :class:`EngineLoop` runs an asyncio loop in its own thread and
  :func:`drive_engine_request` submits one :class:`~calctl.serving.protocol.GenerationRequest`
  through :class:`~calctl.serving.engine.ServingEngine` and consumes its stream,
  streaming or not, cancelling or stopping it on cue (:class:`TokenTap` keeps the
  token ids a stream delivered, for a check against a reference);
* HTTP against a server (``calctl.loadgen.http``).

The record and its outcome classes live with the load generator (:mod:`calctl.loadgen.client`), so a report
counts errors by class the same way whatever the transport.

This module does not decide what traffic to send (``soak.mix``, ``calctl.loadgen.workload``) and does not judge
results.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from calctl.closing import Closes
from calctl.loadgen.client import RequestRecord, signals_held
from calctl.serving import outcomes
from calctl.serving.outcomes import RequestOutcome
from calctl.serving.protocol import (
    EngineRejection,
    FinishReason,
    GenerationRequest,
    RequestStream,
    TokenEvent,
)

T = TypeVar("T")


# ---------------------------------------------------------------------------
# In-process: an asyncio loop of our own, in a thread


class TokenTap:
    """An engine stream that remembers the token ids passing through it, for a check against a reference."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.request_id = stream.request_id
        self.tokens: list[int] = []

    async def admitted(self) -> None:
        await self._stream.admitted()

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenEvent]:
        async for ev in self._stream:
            if ev.token_id is not None and ev.finish is None:
                self.tokens.append(ev.token_id)
            yield ev

    def cancel(self, reason: str = "cancelled") -> None:
        self._stream.cancel(reason)

    def finish(self, reason: FinishReason) -> None:
        self._stream.finish(reason)


class TappedSubmit:
    """A submit function whose streams remember the token ids they delivered (:class:`TokenTap`), by request id."""

    def __init__(self, submit: Callable[[GenerationRequest], Any]) -> None:
        self._submit = submit
        self.taps: dict[str, TokenTap] = {}

    def __call__(self, req: GenerationRequest) -> TokenTap:
        tap = self.taps[req.request_id] = TokenTap(self._submit(req))
        return tap

    def tokens(self, request_id: str) -> list[int]:
        """The token ids ``request_id``'s stream delivered ([] when it was never submitted)."""
        tap = self.taps.get(request_id)
        return tap.tokens if tap is not None else []


class EngineLoop(Closes):
    """An asyncio event loop running in a daemon thread; the engine's streams post into it.

    The tools' main thread keeps the lifecycle (load, unload, fault injection)
    and hands coroutines to this loop with :meth:`submit`. Use as a context
    manager; :meth:`close` cancels whatever is still running and joins.
    """

    def __init__(self, name: str = "calctl-traffic") -> None:
        with signals_held():  # a signal inside the loop's constructor left a half-built loop and a traceback
            self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn`` on the loop thread and return its result."""

        async def run() -> T:
            return fn()

        return self.submit(run()).result(timeout)

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.submit(cancel_all()).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()


@dataclass(frozen=True)
class ClientPlan:
    """What the client does with one request besides reading it.

    ``streaming``: read token by token (TTFT and ITL known); otherwise wait for
    the whole result, as a non-streaming HTTP client does. ``cancel_after_tokens``
    / ``cancel_after_s``: cancel once that many tokens arrived / after that long.
    ``stop_after_tokens``: end early on the caller's decision (a stop string),
    which is a normal finish, not a cancellation.
    """

    kind: str
    streaming: bool = True
    cancel_after_tokens: int | None = None
    cancel_after_s: float | None = None
    stop_after_tokens: int | None = None


@dataclass
class EngineResult:
    """A finished in-process request: the record plus what the soak's generation check needs."""

    record: RequestRecord
    request_id: str
    served_generation: int | None  # the alias's generation right after submit returned
    token_generations: list[int | None] = field(default_factory=list)
    terminal_events: int = 0
    completion_tokens_reported: int | None = None
    synchronous_rejection: bool = False
    token_ids: list[int] = field(default_factory=list)  # what the client received, in order (soak verifies them)


async def drive_engine_request(
    submit: Callable[[GenerationRequest], Any],
    request: GenerationRequest,
    plan: ClientPlan,
    *,
    timeout_s: float,
    served_generation: Callable[[], int | None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    from_admission: bool = False,
) -> EngineResult:
    """Submit ``request`` with ``submit`` (``ServingEngine.submit``, on this loop) and consume its stream.

    Never raises for a request-level outcome; a stream that gives no terminal
    event within ``timeout_s`` is cancelled and recorded as ``timeout``. With
    ``from_admission`` the ``timeout_s`` counts from the engine's admission of
    the request (the wait to be admitted has its own ``timeout_s``), so time
    spent queued behind other requests is not held against it.
    """
    rec = RequestRecord(request.alias, plan.kind, clock(), len(request.prompt_ids), request.max_tokens)
    try:
        stream = submit(request)
    except EngineRejection as exc:
        rec.rejected(exc, clock())
        return EngineResult(rec, request.request_id, None, synchronous_rejection=True)
    result = EngineResult(rec, request.request_id, served_generation())
    loop = asyncio.get_running_loop()
    timer = (
        loop.call_later(plan.cancel_after_s, stream.cancel, "client cancel (timer)")
        if plan.cancel_after_s is not None
        else None
    )
    deadline = rec.sent + timeout_s
    try:
        try:
            await asyncio.wait_for(stream.admitted(), max(0.0, deadline - clock()))
        except EngineRejection as exc:
            rec.rejected(exc, clock())
            result.terminal_events = 1
            return result
        rec.status = 200
        if from_admission:
            deadline = clock() + timeout_s
        if plan.cancel_after_tokens == 0:
            stream.cancel("client cancel")
        events = stream.__aiter__()
        collected: list[float] = []  # a non-streaming client's token times, all seen at the end
        while True:
            ev = await asyncio.wait_for(events.__anext__(), max(0.0, deadline - clock()))
            now = clock()
            if ev.token_id is not None and ev.finish is None:
                _on_token_event(result, ev.token_id, ev.generation, now, plan, stream, collected)
            if ev.finish is not None:
                _on_end_event(result, ev, ev.finish, clock(), plan, collected)
                return result
    except (asyncio.TimeoutError, StopAsyncIteration):
        stream.cancel("client timeout")
        rec.outcome, rec.end, rec.error = RequestOutcome.TIMEOUT, clock(), f"no terminal event within {timeout_s:g} s"
        rec.tokens = len(result.token_generations)
        return result
    except asyncio.CancelledError:
        stream.cancel("client shut down")
        raise
    finally:
        if timer is not None:
            timer.cancel()


def _on_token_event(
    result: EngineResult,
    token_id: int,
    generation: int | None,
    now: float,
    plan: ClientPlan,
    stream: RequestStream,
    collected: list[float],
) -> None:
    """A token arrived at ``now``: record it (a streaming client sees it now), and cancel or stop the stream
    where the client's plan says."""
    result.token_generations.append(generation)
    result.token_ids.append(int(token_id))
    if plan.streaming:
        _on_token(result.record, now)
    else:
        collected.append(now)
    n = len(result.token_generations)
    if plan.cancel_after_tokens is not None and n == plan.cancel_after_tokens:
        stream.cancel("client cancel")
    if plan.stop_after_tokens is not None and n == plan.stop_after_tokens:
        stream.finish(FinishReason.STOP)


def _on_end_event(
    result: EngineResult, ev: TokenEvent, finish: FinishReason, end: float, plan: ClientPlan, collected: list[float]
) -> None:
    """The stream's terminal event at ``end``: the record's end, finish, tokens and outcome."""
    rec = result.record
    result.terminal_events += 1
    if not plan.streaming:  # a non-streaming client sees everything at the end
        for _ in collected:
            _on_token(rec, end)
    rec.end = end
    rec.finish = finish.value
    result.completion_tokens_reported = ev.completion_tokens
    rec.tokens = ev.completion_tokens or len(result.token_generations)
    rec.outcome = outcomes.client_outcome_of_end(finish, ev.outcome)
    if finish is FinishReason.ERROR:
        rec.error = ev.error


def error_reason(error: str | None) -> str:
    """The engine's core reason (``device_error``, ``generation_retired``, ...) of an error, else ``unknown``.

    The engine writes ``"<alias>: <core reason>: <detail>"`` (``EngineCore``); this is for reports that
    break device errors down by cause. The class of an outcome comes from ``TokenEvent.outcome``."""
    parts = (error or "").split(": ", 2)
    return parts[1] if len(parts) >= 2 and parts[1].replace("_", "").isalpha() else "unknown"


def _on_token(rec: RequestRecord, now: float) -> None:
    if rec.first_token is None:
        rec.first_token = now
    rec.token_times.append(now)


__all__ = [
    "ClientPlan",
    "EngineLoop",
    "EngineResult",
    "RequestOutcome",
    "RequestRecord",
    "TappedSubmit",
    "drive_engine_request",
    "error_reason",
]
