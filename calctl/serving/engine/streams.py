"""The thread-to-asyncio bridge for one request: :class:`EngineStream`.

The engine core's thread publishes with ``post_*`` (thread-safe, via the event loop's
``call_soon_threadsafe``); the HTTP layer awaits :meth:`admitted` and iterates
the token events. A stream's terminal event is delivered exactly once (000 §4
rule 3); anything posted after it is ignored.

Inside :func:`one_handoff` (the engine core wraps each step in it) the posts a thread makes are
held and handed to each event loop at the end of the block in one ``call_soon_threadsafe``, in the
order they were made: a step that produces a token for each of N streams wakes the loop once, not N
times, and the loop does not take the GIL from the engine thread while the step still runs.

No scheduling and no device access here.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from calctl.serving import outcomes
from calctl.serving.protocol import EngineRejection, FinishReason, TokenEvent

_Call = tuple[Callable[..., None], tuple[object, ...]]


class _Held(threading.local):
    """The posts of this thread's open :func:`one_handoff` block, by event loop (None: none open)."""

    calls: dict[asyncio.AbstractEventLoop, list[_Call]] | None = None


_held = _Held()


@contextlib.contextmanager
def one_handoff() -> Iterator[None]:
    """Hold the posts this thread makes inside the block; at its end, hand each event loop its posts in one
    ``call_soon_threadsafe``, in order. A nested block joins the outer one. The posts still go out when the
    block ends on an exception (they were made; what follows, such as a failed loop's refusals, comes after)."""
    if _held.calls is not None:
        yield
        return
    _held.calls = {}
    try:
        yield
    finally:
        calls, _held.calls = _held.calls, None
        for loop, batch in calls.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone, nobody is listening
                loop.call_soon_threadsafe(_run_batch, loop, batch)


def _run_batch(loop: asyncio.AbstractEventLoop, batch: list[_Call]) -> None:
    """On the event loop: run a step's posts in order; one that fails is reported and the rest still run."""
    for fn, args in batch:
        try:
            fn(*args)
        except Exception as exc:
            loop.call_exception_handler({"message": f"stream post {fn.__qualname__} failed", "exception": exc})


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
        held = _held.calls
        if held is not None:  # inside one_handoff: goes out with the step's other posts
            held.setdefault(self._loop, []).append((fn, args))
            return
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
