"""Engine rejections become real HTTP statuses; errors after the first SSE byte become an SSE error event."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from calctl.serving.protocol import EngineRejection, RejectCode
from tests.unit.serving_api.api_harness import parse_sse, scan_public
from tests.unit.serving_api.fake_engine import CONTEXT_LIMIT, DEVICE_FAULT, FakeEngine

pytestmark = pytest.mark.anyio

TEXT = {"model": "model-a", "prompt": "hi", "max_tokens": 64}
CHAT = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}]}
BODIES: dict[str, dict[str, Any]] = {"/v1/completions": TEXT, "/v1/chat/completions": CHAT}

# (code, status, type, Retry-After expected from retry_after_s=2.2)
REJECTIONS = [
    (RejectCode.INVALID, 400, "invalid_request_error", None),
    (RejectCode.MODEL_NOT_FOUND, 404, "invalid_request_error", None),
    (RejectCode.CAPACITY, 429, "rate_limit_error", "3"),
    (RejectCode.UNAVAILABLE, 503, "service_unavailable", "3"),
    (RejectCode.DEADLINE, 503, "service_unavailable", "3"),
]


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("queued", [False, True], ids=["at-submit", "while-queued"])
@pytest.mark.parametrize(("code", "status", "type_", "retry_after"), REJECTIONS, ids=[c[0].name for c in REJECTIONS])
async def test_rejection_is_a_real_status(
    client: httpx.AsyncClient,
    engine: FakeEngine,
    path: str,
    stream: bool,
    queued: bool,
    code: RejectCode,
    status: int,
    type_: str,
    retry_after: str | None,
) -> None:
    rejection = EngineRejection(
        code,
        f"refused: {code.value}",
        param="prompt" if code is RejectCode.INVALID else None,
        retry_after_s=2.2 if retry_after else None,
    )
    engine.script(**{"reject_queued" if queued else "reject": rejection})
    r = await client.post(path, json={**BODIES[path], "stream": stream})
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    assert r.headers.get("retry-after") == retry_after
    err = r.json()["error"]
    assert err == {
        "message": f"refused: {code.value}",
        "type": type_,
        # The chat endpoint's prompt is its messages: a prompt refused by the engine is blamed on them.
        "param": {
            RejectCode.INVALID: "messages" if path.endswith("/chat/completions") else "prompt",
            RejectCode.MODEL_NOT_FOUND: "model",
        }.get(code),
        "code": code.value,
    }
    if queued:
        assert engine.streams[0].cancel_calls == ["rejected"]  # the API releases what submit() reserved


@pytest.mark.parametrize("code", [RejectCode.CAPACITY, RejectCode.UNAVAILABLE])
async def test_retry_after_defaults_to_one_second(
    client: httpx.AsyncClient, engine: FakeEngine, code: RejectCode
) -> None:
    engine.script(reject=EngineRejection(code, "busy"))
    r = await client.post("/v1/completions", json=TEXT)
    assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize("path", list(BODIES))
async def test_prompt_over_the_context_states_the_numbers(
    client: httpx.AsyncClient, engine: FakeEngine, path: str
) -> None:
    long_text = "hello " * 300
    body = (
        {**TEXT, "prompt": long_text}
        if path == "/v1/completions"
        else {**CHAT, "messages": [{"role": "user", "content": long_text}]}
    )
    r = await client.post(path, json={**body, "stream": True})
    assert r.status_code == 400
    err = r.json()["error"]
    tokens = len(engine_prompt_ids(engine, path, long_text))
    assert tokens > CONTEXT_LIMIT
    assert str(tokens) in err["message"] and str(CONTEXT_LIMIT) in err["message"]
    want = "messages" if path.endswith("/chat/completions") else "prompt"  # never max_tokens (issue 21)
    assert (err["param"], err["code"]) == (want, "invalid_request_error")


def engine_prompt_ids(engine: FakeEngine, path: str, text: str) -> list[int]:
    codec = engine.codec("model-a")
    if path == "/v1/completions":
        return codec.encode(text)
    return codec.encode(codec.render_chat([{"role": "user", "content": text}]))


@pytest.mark.parametrize("path", list(BODIES))
async def test_alias_not_ready_is_503_with_retry_after(
    client: httpx.AsyncClient, engine: FakeEngine, path: str
) -> None:
    engine.states["model-a"] = "Loading"
    r = await client.post(path, json={**BODIES[path], "stream": True})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "3"  # ceil(2.5)
    assert r.json()["error"]["code"] == "model_unavailable"
    # model-b keeps serving (001 §9.2)
    r = await client.post(path, json={**BODIES[path], "model": "model-b"})
    assert r.status_code == 200


async def test_draining_is_503_for_new_requests(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.draining = True
    r = await client.post("/v1/completions", json=TEXT)
    assert r.status_code == 503 and "retry-after" in r.headers


# -- errors after admission ----------------------------------------------------------------


@pytest.mark.parametrize("path", list(BODIES))
async def test_error_mid_stream_is_an_sse_error_event_without_done(
    client: httpx.AsyncClient, engine: FakeEngine, path: str
) -> None:
    engine.script(error_after=3)
    r = await client.post(path, json={**BODIES[path], "stream": True})
    assert r.status_code == 200  # headers were sent before the fault
    events = parse_sse(r.content)
    assert all(ev.data != "[DONE]" for ev in events)
    assert [ev.event for ev in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1].event == "error"
    err = events[-1].json["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "service_unavailable" and err["code"] == "device_error"
    assert len(events) >= 4 - (path == "/v1/completions")  # tokens were streamed before the error
    assert engine.streams[0].cancel_calls == []  # the engine ended it; nothing to cancel


async def test_error_non_streaming_is_503(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script(error_after=3)
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "device_error"


@pytest.mark.parametrize("stream", [False, True])
async def test_device_fault_details_are_not_shown_to_the_client(
    client: httpx.AsyncClient, engine: FakeEngine, stream: bool
) -> None:
    # The client fixture scans every body; this test makes sure there is something to find.
    with pytest.raises(AssertionError, match="chip"):
        scan_public({"error": {"message": DEVICE_FAULT}})
    engine.script(error_after=1)
    r = await client.post("/v1/completions", json={**TEXT, "stream": stream})
    assert "0xdeadbeef" not in r.text and "ccu0" not in r.text and "/opt/" not in r.text


@pytest.mark.parametrize("path", list(BODIES))
async def test_engine_exception_mid_stream_is_an_sse_error_event(
    client: httpx.AsyncClient, engine: FakeEngine, path: str
) -> None:
    engine.script(raise_after=2)
    r = await client.post(path, json={**BODIES[path], "stream": True})
    events = parse_sse(r.content)
    assert events[-1].event == "error"
    assert events[-1].json["error"]["code"] == "internal_error"
    assert all(ev.data != "[DONE]" for ev in events)
    assert engine.streams[0].cancel_calls == ["engine_error"]  # the request is released, once


async def test_engine_exception_non_streaming_is_a_500_openai_error(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script(raise_after=2)
    r = await client.post("/v1/completions", json=TEXT)
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
