"""The guard in front of every route (``calctl.serving.api.guard``) and the off-loop prompt work (001 §9.2).

In-process over ASGI with the fake engine: the body-size limit while the body arrives, ``X-Request-Id`` on
every response, ``/health/live`` before routing, an upload the client abandons, and tokenization in a model's
own worker thread rather than on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from calctl.serving.api.app import ApiSettings, create_app
from calctl.serving.api.guard import DRAIN_FACTOR, RequestGuard
from tests.unit.serving_api.fake_engine import FakeEngine, package_codec

pytestmark = pytest.mark.anyio

LIMIT = 4096


@pytest.fixture
def settings() -> ApiSettings:
    return ApiSettings(max_body_bytes=LIMIT)


def _body(size: int) -> bytes:
    head = b'{"model": "model-a", "max_tokens": 2, "prompt": "hi", "pad": "'
    return head + b" " * (size - len(head) - 2) + b'"}'


async def test_a_body_over_the_limit_is_413_naming_it_and_never_reaches_the_engine(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    r = await client.post("/v1/completions", content=_body(LIMIT + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and err["type"] == "invalid_request_error"
    assert f"limit of {LIMIT} bytes" in err["message"] and "--max-body-mb" in err["message"]
    assert r.headers["x-request-id"].startswith("req-")
    assert engine.calls == []  # not even the codec: nothing was parsed
    at_limit = await client.post("/v1/completions", content=_body(LIMIT), headers={"content-type": "application/json"})
    assert at_limit.status_code == 200, at_limit.text


async def test_a_chunked_body_is_counted_as_it_arrives(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(DRAIN_FACTOR * 4):
            yield b" " * (LIMIT // 2)

    r = await client.post("/v1/completions", content=chunks())
    assert r.status_code == 413 and engine.calls == []


async def test_every_response_has_a_request_id(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    ok = await client.post("/v1/completions", json={"model": "model-a", "prompt": "hi", "max_tokens": 2})
    assert ok.headers["x-request-id"] == ok.json()["id"]
    chat = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ok = await client.post("/v1/chat/completions", json=chat)
    assert ok.headers["x-request-id"] == ok.json()["id"] and ok.json()["id"].startswith("chatcmpl-")
    bad_json = await client.post("/v1/completions", content=b"{", headers={"content-type": "application/json"})
    unknown = await client.post("/v1/completions", json={"model": "model-z", "prompt": "hi"})
    engine.draining = True
    refused = await client.post("/v1/completions", json={"model": "model-a", "prompt": "hi"})
    others = [await client.get(p) for p in ("/health/live", "/health/ready", "/v1/models", "/nowhere")]
    for r, status in zip([bad_json, unknown, refused, *others], [400, 404, 503, 200, 503, 200, 404], strict=True):
        assert r.status_code == status, (r.request.url, r.text)
        assert r.headers["x-request-id"], r.request.url
    assert bad_json.headers["x-request-id"].startswith("cmpl-") and refused.headers["x-request-id"].startswith("cmpl-")
    ids = [r.headers["x-request-id"] for r in (bad_json, unknown, refused, *others)]
    assert len(set(ids)) == len(ids)


async def test_live_answers_before_routing_even_a_head(app: Any) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        head = await c.head("/health/live")
        assert head.status_code == 200 and head.content == b""
        assert (await c.post("/health/live")).status_code == 405  # only GET/HEAD are the probe


async def test_an_upload_the_client_abandons_is_one_log_line(
    app: Any, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"model": "model-a", "prompt": "', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not messages:
            await asyncio.Event().wait()  # a client that sent everything it will: wait forever
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"t"), (b"content-length", b"900")],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
    }
    with caplog.at_level(logging.INFO, logger="calctl"):
        await asyncio.wait_for(app(scope, receive, send), 5)
    lines = [r for r in caplog.records if "closed the connection while sending its body" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None and "/v1/completions" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]
    assert sent == [] and engine.calls == []  # nobody is listening: no response, nothing parsed


async def test_the_prompt_is_tokenized_in_its_model_worker_not_on_the_loop(
    client: httpx.AsyncClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    codec = package_codec("model-b")
    real = codec.encode

    def encode(text: str) -> list[int]:
        if text != engine.default_script.text:  # the fake engine's own output, not a prompt
            threads.append(threading.current_thread().name)
        return real(text)

    monkeypatch.setattr(codec, "encode", encode)
    r = await client.post("/v1/completions", json={"model": "model-b", "prompt": "hi", "max_tokens": 2})
    chat = {"model": "model-b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r2 = await client.post("/v1/chat/completions", json=chat)
    assert r.status_code == r2.status_code == 200
    assert len(threads) == 2 and all(t.startswith("api-prompt-model-b") for t in threads), threads
    assert threading.main_thread().name not in threads


def test_the_guard_refuses_a_limit_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="max_body_bytes must be > 0"):
        RequestGuard(create_app(FakeEngine()), max_body_bytes=0)
