"""The HTTP layer over a real uvicorn socket on loopback, with the fake engine of tests/unit/serving_api:
the official ``openai`` client (issue 8 acceptance), and client disconnects that only a socket can show.

These start server threads, so they live here rather than with the in-process API tests."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from calctl.serving.api.app import create_app
from calctl.serving.api.auth import ApiSettings
from calctl.serving.protocol import EngineRejection, FinishReason, RejectCode
from tests.unit.serving_api.api_harness import ServerThread
from tests.unit.serving_api.fake_engine import DEFAULT_TEXT, FakeEngine, package_codec

KEY = "sk-alice"
SETTINGS = ApiSettings(api_keys={KEY: "tenant-a"}, admin_keys=frozenset({"adm"}))
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
CHAT = {"model": "model-a", "messages": [{"role": "user", "content": "Say hello."}]}
TEXT = {"model": "model-a", "prompt": "Say hello.", "max_tokens": 64}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    """``serve(engine, settings)`` -> a running uvicorn ServerThread; all are shut down after the test."""
    servers: list[ServerThread] = []

    def start(engine: FakeEngine, settings: ApiSettings | None = None) -> ServerThread:
        server = ServerThread(create_app(engine, settings or ApiSettings()))
        servers.append(server.__enter__())
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def server(serve: Callable[..., ServerThread], engine: FakeEngine) -> ServerThread:
    return serve(engine, SETTINGS)


@pytest.fixture
def oai(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=10) as c:
        yield c


def test_lists_models(oai: openai.OpenAI, engine: FakeEngine) -> None:
    assert [m.id for m in oai.models.list()] == ["model-a", "model-b"]
    engine.states["model-b"] = "Draining"
    assert [m.id for m in oai.models.list()] == ["model-a"]


@pytest.mark.parametrize("model", ["model-a", "model-b"])
def test_chat_completion(oai: openai.OpenAI, engine: FakeEngine, model: str) -> None:
    out = oai.chat.completions.create(model=model, messages=MESSAGES, temperature=0, seed=1)
    assert out.object == "chat.completion" and out.model == model
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == DEFAULT_TEXT
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.completion_tokens == len(package_codec(model).encode(DEFAULT_TEXT))
    assert engine.submitted[0].tenant == "tenant-a" and engine.submitted[0].sampling.greedy


@pytest.mark.parametrize("model", ["model-a", "model-b"])
def test_text_completion(oai: openai.OpenAI, model: str) -> None:
    out = oai.completions.create(model=model, prompt="Say hello.", max_tokens=5)
    assert out.object == "text_completion"
    codec = package_codec(model)
    assert out.choices[0].text == codec.decode(codec.encode(DEFAULT_TEXT)[:5])
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 5


@pytest.mark.parametrize("model", ["model-a", "model-b"])
def test_chat_streaming_with_usage(oai: openai.OpenAI, model: str) -> None:
    chunks = list(
        oai.chat.completions.create(
            model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, stop=["says"]
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world, the calculet "
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


@pytest.mark.parametrize("model", ["model-a", "model-b"])
def test_text_streaming(oai: openai.OpenAI, model: str) -> None:
    chunks = list(oai.completions.create(model=model, prompt="Say hello.", max_tokens=64, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == DEFAULT_TEXT
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_errors_map_to_openai_exceptions(oai: openai.OpenAI, engine: FakeEngine) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        oai.chat.completions.create(model="model-z", messages=MESSAGES)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.completions.create(model="model-a", prompt="hi", n=2)
    assert bad.value.param == "n"
    engine.script(reject=EngineRejection(RejectCode.CAPACITY, "tenant-a is over its share", retry_after_s=4))
    with pytest.raises(openai.RateLimitError) as limited:
        oai.completions.create(model="model-a", prompt="hi", stream=True)
    assert limited.value.response.headers["retry-after"] == "4"


def test_wrong_key_is_an_authentication_error(server: ServerThread) -> None:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-mallory", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


def test_error_mid_stream_raises_in_the_client(oai: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script(error_after=2)
    stream = oai.chat.completions.create(model="model-a", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match="the model failed while generating"):
        for _ in stream:
            pass


# -- over a real socket ------------------------------------------------------------------------


def test_uvicorn_stream_socket_close_cancels_once(serve: Callable[..., ServerThread], engine: FakeEngine) -> None:
    engine.script(pause_after=4)
    server = serve(engine)
    with httpx.Client(base_url=server.base_url, timeout=5) as http:
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
            s = engine.stream_blocking()
            s.paused.wait_blocking()
        # leaving the block closes the half-read response, and with it the connection
    s.cancelled.wait_blocking()
    assert s.cancel_calls == ["client_disconnected"]
    assert s.outcome is FinishReason.CANCELLED


def test_uvicorn_non_streaming_socket_close_while_queued_cancels_once(
    serve: Callable[..., ServerThread], engine: FakeEngine
) -> None:
    engine.script(hold_queued=True)
    server = serve(engine)
    body = json.dumps(TEXT).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        s = engine.stream_blocking()
        s.queued.wait_blocking()
    s.cancelled.wait_blocking()
    assert s.cancel_calls == ["client_disconnected"]
    assert s.sent == []
