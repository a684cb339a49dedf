"""The thread-to-asyncio bridge for one request: :class:`EngineStream`.

The engine core's thread publishes with ``post_*`` (thread-safe, via the event loop's
``call_soon_threadsafe``); the HTTP layer awaits :meth:`admitted` and iterates
the token events. A stream's terminal event is delivered exactly once (000 §4
rule 3); anything posted after it is ignored.

No scheduling and no device access here.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable

from calctl.serving import outcomes
from calctl.serving.protocol import EngineRejection, FinishReason, TokenEvent


class EngineStream:
    def __init__(
        self,
        request_id: str,
        loop: asyncio.AbstractEventLoop,
        *,
        on_cancel: Callable[[str, str], object],
        on_finish: Callable[[str, FinishReason], object],
    ) -> None:
        self.request_id = request_id
        self._loop = loop
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._admitted: asyncio.Future[None] = loop.create_future()
        self._on_cancel = on_cancel
        self._on_finish = on_finish
        self._closed = threading.Event()  # terminal event posted
        self._cancelled = False
        self._lock = threading.Lock()

    # -- engine side (any thread) ---------------------------------------------------------

    def post_admitted(self) -> None:
        self._call(self._set_admitted)

    def post_rejected(self, rejection: EngineRejection) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._call(self._set_rejected, rejection)

    def post_token(self, event: TokenEvent) -> None:
        if self._closed.is_set():
            return
        self._call(self._put, event, True)

    def post_end(self, event: TokenEvent) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._call(self._put, event, True)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone, nobody is listening
            self._loop.call_soon_threadsafe(fn, *args)

    def _set_admitted(self) -> None:
        if not self._admitted.done():
            self._admitted.set_result(None)

    def _set_rejected(self, rejection: EngineRejection) -> None:
        if not self._admitted.done():
            self._admitted.set_exception(rejection)
        else:  # admitted earlier, then ended before its first token (e.g. its deadline while PrefillReady)
            outcome = outcomes.rejection(rejection.code).outcome.value
            self._queue.put_nowait(TokenEvent(None, FinishReason.ERROR, error=rejection.message, outcome=outcome))

    def _put(self, event: TokenEvent, admit: bool) -> None:
        if admit:
            self._set_admitted()
        self._queue.put_nowait(event)

    # -- API side (event loop) --------------------------------------------------------------

    async def admitted(self) -> None:
        await self._admitted

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if event.finish is not None:
                return

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._cancelled or self._closed.is_set():
                return
            self._cancelled = True
        self._on_cancel(self.request_id, reason)

    def finish(self, reason: FinishReason) -> None:
        with self._lock:
            if self._cancelled or self._closed.is_set():
                return
            self._cancelled = True
        self._on_finish(self.request_id, reason)
