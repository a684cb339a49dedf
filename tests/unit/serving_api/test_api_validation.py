"""Invalid requests are 400 with an OpenAI error body naming the parameter, before the engine and before any SSE byte."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from tests.unit.serving_api.fake_engine import FakeEngine, package_codec

pytestmark = pytest.mark.anyio

TEXT = {"model": "model-a", "prompt": "hi"}
CHAT = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}]}
MODEL_A_VOCAB = 384  # manifest.yaml

# (path, body, param named in the error)
INVALID: list[tuple[str, dict[str, Any], str | None]] = [
    ("/v1/completions", {"prompt": "hi"}, "model"),
    ("/v1/chat/completions", {"messages": CHAT["messages"]}, "model"),
    ("/v1/completions", {**TEXT, "model": ""}, "model"),
    ("/v1/completions", {**TEXT, "temperature": 2.5}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "temperature": -0.1}, "temperature"),
    ("/v1/completions", {**TEXT, "top_p": 0}, "top_p"),
    ("/v1/completions", {**TEXT, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1}, "max_completion_tokens"),
    ("/v1/completions", {**TEXT, "n": 2}, "n"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, "n"),
    ("/v1/completions", {**TEXT, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {**TEXT, "logprobs": -1}, "logprobs"),
    ("/v1/completions", {**TEXT, "logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": 2}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    # The sampling parameters' ranges (docs/serve.md "Sampling parameters").
    ("/v1/completions", {**TEXT, "top_k": -2}, "top_k"),
    ("/v1/chat/completions", {**CHAT, "top_k": 1.5}, "top_k"),
    ("/v1/completions", {**TEXT, "min_p": 1.5}, "min_p"),
    ("/v1/chat/completions", {**CHAT, "min_p": -0.1}, "min_p"),
    ("/v1/completions", {**TEXT, "frequency_penalty": 2.5}, "frequency_penalty"),
    ("/v1/chat/completions", {**CHAT, "frequency_penalty": -2.01}, "frequency_penalty"),
    ("/v1/completions", {**TEXT, "presence_penalty": -3}, "presence_penalty"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": "1"}, "presence_penalty"),
    ("/v1/completions", {**TEXT, "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/chat/completions", {**CHAT, "repetition_penalty": -1.0}, "repetition_penalty"),
    ("/v1/completions", {**TEXT, "repetition_penalty": 2.5}, "repetition_penalty"),
    ("/v1/completions", {**TEXT, "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"5": -100.5}}, "logit_bias"),
    ("/v1/completions", {**TEXT, "logit_bias": {"hello": 1}}, "logit_bias"),
    ("/v1/completions", {**TEXT, "logit_bias": {"-5": 1}}, "logit_bias"),
    ("/v1/completions", {**TEXT, "logit_bias": {"5": "1"}}, "logit_bias"),
    ("/v1/completions", {**TEXT, "logit_bias": [5, 1]}, "logit_bias"),
    ("/v1/completions", {**TEXT, "logit_bias": {str(MODEL_A_VOCAB): 1}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"99999999999": 1}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"5": 1, "05": 2}}, "logit_bias"),
    ("/v1/completions", {**TEXT, "ignore_eos": "yes"}, "ignore_eos"),
    ("/v1/completions", {**TEXT, "stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
    # Python's json (Starlette's request.json()) reads NaN and Infinity; no range holds them.
    ("/v1/completions", {**TEXT, "min_p": math.nan}, "min_p"),
    ("/v1/completions", {**TEXT, "frequency_penalty": math.nan}, "frequency_penalty"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": -math.inf}, "presence_penalty"),
    ("/v1/completions", {**TEXT, "repetition_penalty": math.nan}, "repetition_penalty"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"5": math.nan}}, "logit_bias"),
    ("/v1/completions", {**TEXT, "echo": True}, "echo"),
    ("/v1/completions", {**TEXT, "best_of": 3}, "best_of"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {**TEXT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/completions", {**TEXT, "stop": 5}, "stop"),
    ("/v1/completions", {**TEXT, "prompt": [5, MODEL_A_VOCAB]}, "prompt"),
    ("/v1/completions", {**TEXT, "prompt": [5, -1]}, "prompt"),
    ("/v1/completions", {**TEXT, "prompt": []}, "prompt"),
    ("/v1/completions", {**TEXT, "prompt": ["one", "two"]}, "prompt"),
    ("/v1/completions", {"model": "model-a"}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": "model-a"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    (
        "/v1/chat/completions",
        {
            **CHAT,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look:"},
                        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                    ],
                }
            ],
        },
        "messages",
    ),
    ("/v1/completions", {**TEXT, "stream_options": {"include_usage": "maybe"}}, "stream_options"),
    ("/v1/completions", {**TEXT, "timeout": 0}, "timeout"),
    # OpenAI's seed is a 64-bit integer (as vLLM bounds it); beyond it is the client's error, not the engine's.
    ("/v1/completions", {**TEXT, "seed": 2**63}, "seed"),
    ("/v1/chat/completions", {**CHAT, "seed": -(2**63) - 1}, "seed"),
    # Typed as OpenAI types them: pydantic's lax mode would read these as 1, 5, 0.5, 1 and [1, 5].
    ("/v1/completions", {**TEXT, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 5.0}, "max_completion_tokens"),
    ("/v1/completions", {**TEXT, "temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": True}, "top_p"),
    ("/v1/completions", {**TEXT, "seed": "7"}, "seed"),
    ("/v1/completions", {**TEXT, "prompt": [True, 5]}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": 1}}, "stream_options"),
    ("/v1/completions", {**TEXT, "timeout": "30"}, "timeout"),
]


def _id(case: tuple[str, dict[str, Any], str | None]) -> str:
    path, body, param = case
    return f"{path.rsplit('/', 1)[-1]}-{param}-{sorted(set(body) - {'model', 'prompt', 'messages'}) or 'missing'}"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", INVALID, ids=[_id(c) for c in INVALID])
async def test_invalid_request_is_400_naming_the_param(
    client: httpx.AsyncClient, engine: FakeEngine, case: tuple[str, dict[str, Any], str | None], stream: bool
) -> None:
    path, body, param = case
    # json.dumps writes NaN and Infinity (httpx's json= refuses them), as some clients do.
    raw = json.dumps({"stream": stream, **body})  # a case that sets stream itself keeps it
    r = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"  # a real status and a JSON body, not an SSE stream
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] is not None and err["param"].split(".")[0] == param
    assert err["message"]
    assert engine.submitted == []  # rejected before the engine


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"model": "model-a", "prompt": ', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        # Python's json reads these, but with ValueError (digits past its int limit) or RecursionError, not a
        # JSONDecodeError; a lone surrogate parses into a str that no tokenizer (nor UTF-8) can take.
        (b'{"model": "model-a", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"model": "model-a", "prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
        (b'{"model": "model-a", "prompt": "\\ud800"}', "not valid JSON text: a string holds a lone UTF-16 surrogate"),
        (b'{"model": "model-a", "messages": [{"role": "user", "content": "a\\udfff"}]}', "lone UTF-16 surrogate"),
        (b'["model-a", "hi"]', "must be a JSON object"),
        (b'"hi"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
    ],
)
async def test_body_that_is_not_a_json_object_is_400(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, raw: bytes, message: str
) -> None:
    r = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert message in err["message"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", None, "invalid_json")
    assert engine.calls == []


async def test_out_of_vocab_message_states_the_id_and_the_vocabulary(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={**TEXT, "prompt": [1, 2, 999]})
    msg = r.json()["error"]["message"]
    assert "999" in msg and "384" in msg


async def test_vocabulary_is_the_alias_own(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    # Token 400 exists in model-b (512 entries) but not in model-a (384): 001 §8.3.
    assert package_codec("model-b").vocab_size == 512
    assert (await client.post("/v1/completions", json={**TEXT, "prompt": [400]})).status_code == 400
    assert (await client.post("/v1/completions", json={**TEXT, "model": "model-b", "prompt": [400]})).status_code == 200


async def test_harmless_defaults_and_unknown_fields_are_accepted(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {
        **CHAT,
        "n": 1,
        "logprobs": False,
        "echo": False,
        "best_of": 1,
        "logit_bias": {},
        "tools": None,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "some_vendor_extension": {"x": 1},
    }
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


async def test_four_stops_are_accepted(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={**TEXT, "stop": ["a", "b", "c", "d"], "max_tokens": 64})
    assert r.status_code == 200


async def test_model_without_chat_template_is_400_on_chat(
    client: httpx.AsyncClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(package_codec("model-b"), "chat_template", None)
    r = await client.post("/v1/chat/completions", json={**CHAT, "model": "model-b"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"
    assert "/v1/completions" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": []},
        {"functions": []},
        {"response_format": {"type": "text"}},
        {"suffix": ""},
        {"logit_bias": None},
        {"top_logprobs": 0},
    ],
    ids=lambda e: next(iter(e)),
)
async def test_empty_or_default_values_of_unsupported_fields_are_accepted(
    client: httpx.AsyncClient, extra: dict
) -> None:
    # Client libraries send these empty/default values routinely; they ask for nothing calctl lacks.
    r = await client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405), ("PUT", "/v1/models", 405)],
)
async def test_unknown_routes_and_methods_get_openai_error_bodies(
    client: httpx.AsyncClient, method: str, path: str, status: int
) -> None:
    r = await client.request(method, path)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("value", ["true", 1])
async def test_stream_takes_a_boolean_only(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, value: Any
) -> None:
    body = TEXT if path.endswith("/completions") and "chat" not in path else CHAT
    r = await client.post(path, json={**body, "stream": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream"
    assert engine.submitted == []


async def test_integer_numbers_are_numbers(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    """temperature 0 and top_p 1 as JSON integers, as the openai client sends them: accepted."""
    r = await client.post("/v1/completions", json={**TEXT, "temperature": 0, "top_p": 1, "timeout": 30})
    assert r.status_code == 200, r.text
    assert len(engine.submitted) == 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_null_is_the_default(client: httpx.AsyncClient, engine: FakeEngine, path: str) -> None:
    """The openai client sends null for a parameter given as None (``temperature=None``); OpenAI takes it."""
    body = TEXT if "chat" not in path else CHAT
    nulls = {"temperature": None, "top_p": None, "n": None, "stream": None, "max_tokens": None, "seed": None}
    r = await client.post(path, json={**body, **nulls, "stream_options": None, "stop": None, "user": None})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")  # stream: null is no stream
    (sent,) = engine.submitted
    assert (sent.sampling.temperature, sent.sampling.top_p, sent.sampling.seed) == (1.0, 1.0, None)
