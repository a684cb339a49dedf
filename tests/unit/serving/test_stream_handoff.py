"""The engine thread hands a step's stream posts to each event loop in one wake-up (streams.one_handoff).

A step that produces a token for each of several streams calls ``call_soon_threadsafe`` once per event loop,
not once per token; the events arrive in the order they were posted; posts made outside a step (or after a
failed one) still go out at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from calctl.serving.engine.streams import EngineStream, one_handoff
from calctl.serving.protocol import FinishReason, TokenEvent


class CountingLoop:
    """An event loop whose ``call_soon_threadsafe`` calls are counted (the real loop still runs them)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.handoffs = 0
        real = self.loop.call_soon_threadsafe

        def counted(fn: Callable[..., Any], *args: Any) -> Any:
            self.handoffs += 1
            return real(fn, *args)

        self.loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]

    def stream(self, rid: str) -> EngineStream:
        return EngineStream(rid, self.loop, on_cancel=lambda *_: None, on_finish=lambda *_: None)

    def collect(self, streams: list[EngineStream]) -> list[list[int | None]]:
        async def one(s: EngineStream) -> list[int | None]:
            await s.admitted()
            return [ev.token_id async for ev in s]

        async def every() -> list[list[int | None]]:
            return list(await asyncio.wait_for(asyncio.gather(*(one(s) for s in streams)), 10))

        return self.loop.run_until_complete(every())


def _on_thread(fn: Callable[[], None]) -> None:
    """Post from another thread, as the engine core does."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    if errors:
        raise errors[0]


def _tokens(stream: EngineStream, ids: range) -> None:
    for i in ids:
        stream.post_token(TokenEvent(i, prompt_tokens=1, completion_tokens=i + 1))


@pytest.fixture
def counting() -> Iterator[CountingLoop]:
    c = CountingLoop()
    yield c
    c.loop.close()


def test_a_steps_posts_to_many_streams_wake_the_loop_once_in_order(counting: CountingLoop) -> None:
    streams = [counting.stream(f"r{i}") for i in range(4)]

    def step() -> None:
        with one_handoff():
            for s in streams:
                s.post_admitted()
            for s in streams:
                _tokens(s, range(3))
            with one_handoff():  # a nested block joins the outer one
                for s in streams:
                    s.post_end(TokenEvent(None, FinishReason.LENGTH, prompt_tokens=1, completion_tokens=3))
            assert counting.handoffs == 0  # nothing left the thread before the block ended

    _on_thread(step)
    assert counting.handoffs == 1
    assert counting.collect(streams) == [[0, 1, 2, None]] * 4


def test_posts_outside_a_step_go_out_one_by_one(counting: CountingLoop) -> None:
    s = counting.stream("r")

    def posts() -> None:
        _tokens(s, range(2))
        s.post_end(TokenEvent(None, FinishReason.STOP, prompt_tokens=1, completion_tokens=2))

    _on_thread(posts)
    assert counting.handoffs == 3
    assert counting.collect([s]) == [[0, 1, None]]


def test_a_failed_step_still_hands_off_what_it_posted_before_what_follows(counting: CountingLoop) -> None:
    s = counting.stream("r")

    def failing_step() -> None:
        try:
            with one_handoff():
                _tokens(s, range(2))
                raise RuntimeError("a bug in the step")
        except RuntimeError:
            # what a dying loop does next (post directly) arrives after the step's posts
            s.post_end(TokenEvent(None, FinishReason.ERROR, error="internal", prompt_tokens=1, completion_tokens=2))

    _on_thread(failing_step)
    assert counting.handoffs == 2
    assert counting.collect([s]) == [[0, 1, None]]


def test_a_post_that_fails_on_the_loop_does_not_drop_the_others(counting: CountingLoop) -> None:
    s = counting.stream("r")
    reported: list[dict[str, Any]] = []
    counting.loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))

    def broken() -> None:
        raise ValueError("broken post")

    def step() -> None:
        with one_handoff():
            s.post_admitted()
            s._call(broken)  # a post whose callback raises on the loop
            _tokens(s, range(1))
            s.post_end(TokenEvent(None, FinishReason.LENGTH, prompt_tokens=1, completion_tokens=1))

    _on_thread(step)
    assert counting.collect([s]) == [[0, None]]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], ValueError)
