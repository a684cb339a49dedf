"""A client that leaves cancels its request exactly once, streaming or not, queued or generating (000 §4, 001 §10.1).

In-process tests drive the ASGI app by hand (``AsgiCall``) so the disconnect
arrives at a chosen moment; the uvicorn tests close a real socket.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from calctl.serving.protocol import FinishReason
from tests.unit.serving_api.api_harness import AsgiCall, parse_sse
from tests.unit.serving_api.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

TEXT = {"model": "model-a", "prompt": "hi", "max_tokens": 64}
CHAT = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}]}
BODIES: dict[str, dict[str, Any]] = {"/v1/completions": TEXT, "/v1/chat/completions": CHAT}


def call(app: Any, path: str, **extra: Any) -> AsgiCall:
    return AsgiCall(app, "POST", path, {**BODIES[path], **extra}).start()


@pytest.mark.parametrize("path", list(BODIES))
async def test_stream_disconnect_mid_stream_cancels_once(app: Any, engine: FakeEngine, path: str) -> None:
    engine.script(pause_after=3)
    c = call(app, path, stream=True)
    try:
        assert await c.start_response() == 200
        s = await engine.stream()
        await s.paused.wait()
        events = await c.read_events(3)
        assert all(ev.data != "[DONE]" for ev in events)
        c.disconnect()
        await s.cancelled.wait()
        await c.done()
        assert s.cancel_calls == ["client_disconnected"]
        assert s.finish_calls == []
        assert s.outcome is FinishReason.CANCELLED  # the engine stops generating (and reclaims)
    finally:
        await c.close()


async def test_stream_disconnect_while_the_client_stopped_reading_cancels_once(app: Any, engine: FakeEngine) -> None:
    # The generator is parked at a ``yield`` (send() blocked on a full socket), not inside the engine, when
    # the client leaves: cancellation then never reaches the generator's body by itself.
    engine.script(eos=False)
    c = call(app, "/v1/completions", stream=True, max_tokens=10_000)
    try:
        await c.start_response()
        s = await engine.stream()
        await c.read_events(2)
        c.stop_reading()
        c.disconnect()
        await s.cancelled.wait(timeout=2)
        await c.done()
        assert s.cancel_calls == ["client_disconnected"]
        assert s.sent[-1].completion_tokens < 10_000
    finally:
        await c.close()


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_while_queued_cancels_once(app: Any, engine: FakeEngine, path: str, stream: bool) -> None:
    engine.script(hold_queued=True)
    c = call(app, path, stream=stream)
    try:
        s = await engine.stream()
        await s.queued.wait()
        c.disconnect()
        await s.cancelled.wait()
        await c.done()
        assert s.cancel_calls == ["client_disconnected"]
        assert s.sent == []  # never admitted, never generated
    finally:
        await c.close()


@pytest.mark.parametrize("path", list(BODIES))
async def test_stream_disconnect_before_the_first_byte_cancels_once(app: Any, engine: FakeEngine, path: str) -> None:
    # Admitted, then gone while the response headers are still being written: the response is abandoned
    # before its body generator ever runs, so the generator cannot be what cancels.
    engine.script(hold_queued=True)
    c = call(app, path, stream=True)
    try:
        s = await engine.stream()
        await s.queued.wait()
        c.stop_reading()
        s.release()
        await asyncio.wait_for(c.send_blocked.wait(), 5)
        c.disconnect()
        await s.cancelled.wait(timeout=2)
        await c.done()
        assert s.cancel_calls == ["client_disconnected"]
        assert s.outcome is FinishReason.CANCELLED
    finally:
        await c.close()


@pytest.mark.parametrize("path", list(BODIES))
async def test_non_streaming_disconnect_while_generating_cancels_once(app: Any, engine: FakeEngine, path: str) -> None:
    engine.script(pause_after=2)
    c = call(app, path)
    try:
        s = await engine.stream()
        await s.paused.wait()
        c.disconnect()
        await s.cancelled.wait()
        await c.done()
        assert s.cancel_calls == ["client_disconnected"]
        assert s.outcome is FinishReason.CANCELLED
    finally:
        await c.close()


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_stays_is_never_cancelled(app: Any, engine: FakeEngine, path: str, stream: bool) -> None:
    engine.script(hold_queued=True, pause_after=2)
    c = call(app, path, stream=stream)
    try:
        s = await engine.stream()
        await s.queued.wait()
        s.released.set()  # admits and, being one latch, also lets the pause pass
        assert await c.start_response() == 200
        body = await c.read_all()
        await c.done()
        if stream:
            assert parse_sse(body)[-1].data == "[DONE]"
        assert s.cancel_calls == [] and s.terminal is FinishReason.STOP
    finally:
        await c.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_delete_internal_request_ends_a_live_request(
    app: Any, client: httpx.AsyncClient, engine: FakeEngine, stream: bool
) -> None:
    engine.script(pause_after=2)
    c = call(app, "/v1/completions", stream=stream)
    try:
        s = await engine.stream()
        await s.paused.wait()
        r = await client.delete(f"/internal/requests/{s.request_id}")
        assert (r.status_code, r.json()) == (200, {"id": s.request_id, "cancelled": True})
        assert await c.start_response() == 200
        body = await c.read_all()
        if stream:
            events = parse_sse(body)
            assert events[-1].data == "[DONE]"
            assert events[-2].json["choices"][0]["finish_reason"] == "cancelled"
        else:
            assert json.loads(body)["choices"][0]["finish_reason"] == "cancelled"
        assert s.cancel_calls == []  # the engine ended it; the API had nothing more to cancel
        r = await client.delete(f"/internal/requests/{s.request_id}")  # already ended
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "request_not_found"
    finally:
        await c.close()


async def test_delete_unknown_request_is_404(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.delete("/internal/requests/cmpl-doesnotexist")
    assert r.status_code == 404
    assert engine.engine_cancels == ["cmpl-doesnotexist"]


# The same over a real uvicorn socket: tests/integration/test_serve_api_uvicorn.py.
