"""The guard in front of every route (``calctl.serving.api.guard``) and the off-loop prompt work (001 §9.2).

In-process over ASGI with the fake engine: the body-size limit while the body arrives, ``X-Request-Id`` on
every response, ``/health/live`` before routing, an upload the client abandons, and tokenization in a model's
own worker thread rather than on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from calctl.serving.api.app import create_app
from calctl.serving.api.auth import ApiSettings
from calctl.serving.api.guard import DRAIN_FACTOR, Intake, RequestGuard
from calctl.serving.api.workers import INLINE_BODY
from tests.unit.serving_api.fake_engine import FakeEngine, package_codec

pytestmark = pytest.mark.anyio

LIMIT = 64 * 1024


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


def _tokenizing_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads model-b's prompts are tokenized in, in order."""
    threads: list[str] = []
    codec = package_codec("model-b")
    real = codec.encode_within

    def encode_within(text: str, limit: int) -> tuple[list[int] | None, int]:
        threads.append(threading.current_thread().name)
        return real(text, limit)

    monkeypatch.setattr(codec, "encode_within", encode_within)
    return threads


async def test_the_prompt_is_tokenized_in_its_model_worker_not_on_the_loop(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = _tokenizing_threads(monkeypatch)
    pad = " " * INLINE_BODY  # JSON whitespace: the body is no longer small enough for the loop
    r = await client.post(
        "/v1/completions",
        content=f'{{"model": "model-b", "prompt": "hi", "max_tokens": 2}}{pad}',
        headers={"content-type": "application/json"},
    )
    chat = f'{{"model": "model-b", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 2}}{pad}'
    r2 = await client.post("/v1/chat/completions", content=chat, headers={"content-type": "application/json"})
    assert r.status_code == r2.status_code == 200, (r.text, r2.text)
    assert len(threads) == 2 and all(t.startswith("api-prompt-model-b") for t in threads), threads
    assert threading.main_thread().name not in threads


async def test_a_body_under_the_inline_size_is_parsed_and_tokenized_on_the_loop(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hand-offs to worker threads cost a short request more time to first token than its bounded work
    (workers.INLINE_BODY); one byte more and the work goes to the threads."""
    threads = _tokenizing_threads(monkeypatch)
    loop_thread = threading.current_thread().name
    head = '{"model": "model-b", "prompt": "hi", "max_tokens": 2}'
    for size in (INLINE_BODY - 1, INLINE_BODY):
        body = head + " " * (size - len(head))
        r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
    assert threads[0] == loop_thread and threads[1].startswith("api-prompt-model-b"), threads


def test_the_guard_refuses_a_limit_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="max_body_bytes must be > 0"):
        RequestGuard(create_app(FakeEngine()), max_body_bytes=0)


@pytest.mark.parametrize(
    ("path", "body", "param", "count"),
    [
        ("/v1/completions", {"prompt": [5] * 300}, "prompt", 300),
        ("/v1/completions", {"prompt": [5] * 256}, "prompt", 256),  # no room left for one output token
        ("/v1/completions", {"prompt": "word " * 400}, "prompt", None),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 400}]}, "messages", None),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 300}, "messages", 300),
    ],
)
async def test_a_prompt_past_the_context_is_refused_before_its_ids_are_built(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, body: dict[str, Any], param: str, count: int | None
) -> None:
    """The count of a prompt that cannot fit is all the API needs: no ids, no schema over a million entries."""
    r = await client.post(path, json={"model": "model-a", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "invalid_request_error" and "256" in err["message"], err
    assert count is None or str(count) in err["message"]
    assert engine.submitted == []


async def test_fits_at_context_minus_one_and_small_bodies_keep_field_errors_first(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    fits = await client.post("/v1/completions", json={"model": "model-a", "prompt": [5] * 255, "max_tokens": 1})
    assert fits.status_code == 200, fits.text
    assert len(engine.submitted[0].prompt_ids) == 255
    small = await client.post("/v1/completions", json={"model": "model-z", "prompt": [5] * 10, "max_tokens": "x"})
    assert small.status_code == 400 and small.json()["error"]["param"] == "max_tokens"
    heavy = await client.post("/v1/completions", json={"model": "model-z", "prompt": [5] * 5000, "max_tokens": "x"})
    assert heavy.status_code == 404 and heavy.json()["error"]["code"] == "model_not_found"
    chat = {"model": "model-a", "messages": [{"role": "user", "content": "x"}] * 3 + [{"role": "robot"}]}
    bad = await client.post("/v1/chat/completions", json=chat)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages.3.role", bad.text


async def test_the_http_layer_reports_its_own_400s_of_a_served_model(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """Every request has a 001 §14 record: the 400s decided before the engine reach it through
    ``EngineClient.refused``, with the prompt's size when it was counted; a body naming no served model
    (or none) reports nothing, since a client's made-up name must not become a metric label."""
    sent = [
        ({"model": "model-a", "prompt": [5] * 300}, 300),
        ({"model": "model-a", "prompt": "hi", "temperature": 9}, None),
        ({"model": "model-b", "prompt": [1, 9999]}, 2),
        ({"model": "model-z", "prompt": "hi", "temperature": 9}, None),
        ({"prompt": "hi"}, None),
    ]
    ids = []
    for body, _ in sent:
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 400, r.text
        ids.append(r.headers["x-request-id"])
    got = [(f.request_id, f.alias, f.prompt_tokens, f.rejection.code.value) for f in engine.refusals]
    assert got == [
        (ids[0], "model-a", 300, "invalid_request_error"),
        (ids[1], "model-a", None, "invalid_request_error"),
        (ids[2], "model-b", 2, "invalid_request_error"),
        (ids[3], "model-z", None, "invalid_request_error"),  # the engine ignores names it does not serve
    ]
    assert engine.submitted == []


async def test_large_bodies_are_read_at_the_intake_rate_past_their_burst(engine: FakeEngine) -> None:
    """Bodies past BIG_BODY bytes share one token bucket: with 1 MiB/s and a 128 KiB burst, 640 KiB of
    large bodies cannot all be read in under (640 - 2 x 64 - 128) KiB / 1 MiB/s (a lower bound: never flaky)."""
    app = RequestGuard(
        create_app(engine, ApiSettings(max_body_bytes=4 * 1024 * 1024)),
        max_body_bytes=4 * 1024 * 1024,
        intake=Intake(rate=1024 * 1024, burst=128 * 1024),
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    body = {"model": "model-a", "prompt": "hi", "max_tokens": 2, "pad": " " * (320 * 1024)}
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as c:
        start = time.monotonic()
        for _ in range(2):
            assert (await c.post("/v1/completions", json=body)).status_code == 200
        took = time.monotonic() - start
    assert took >= (2 * (320 - 64) - 128) / 1024, took


def test_the_intake_refuses_a_rate_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="rate"):
        Intake(rate=0)
