"""POST /v1/completions and /v1/chat/completions: OpenAI bodies, SSE, usage, finish_reason, stop and EOS."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from calctl.serving.protocol import FinishReason, SamplingParams
from tests.unit.serving_api.api_harness import SseEvent, parse_sse
from tests.unit.serving_api.fake_engine import CONTEXT_LIMIT, DEFAULT_TEXT, EOS_TOKEN_ID, FakeEngine, package_codec

pytestmark = pytest.mark.anyio

PATHS = {"text": "/v1/completions", "chat": "/v1/chat/completions"}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def request_body(kind: str, model: str = "model-a", **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, **kw}
    if kind == "text":
        body.setdefault("prompt", "Say hello.")
        body.setdefault("max_tokens", 64)  # the OpenAI default of 16 would cut DEFAULT_TEXT (22 tokens with EOS)
    else:
        body.setdefault("messages", MESSAGES)
    return body


def text_of(kind: str, body: dict[str, Any]) -> str:
    choice = body["choices"][0]
    return choice["text"] if kind == "text" else choice["message"]["content"]


def stream_text(kind: str, events: list[SseEvent]) -> str:
    out = []
    for ev in events:
        if ev.data == "[DONE]" or not ev.json["choices"]:
            continue
        choice = ev.json["choices"][0]
        out.append(choice["text"] if kind == "text" else choice["delta"].get("content") or "")
    return "".join(out)


def finish_of(events: list[SseEvent]) -> list[str]:
    return [
        ev.json["choices"][0]["finish_reason"]
        for ev in events
        if ev.data != "[DONE]" and ev.json["choices"] and ev.json["choices"][0]["finish_reason"] is not None
    ]


def expected_usage(engine: FakeEngine, index: int = 0) -> dict[str, int]:
    """The engine's count less the EOS that ended the stream (OpenAI and llama.cpp do not count it)."""
    last = engine.streams[index].sent[-1]
    completion = last.completion_tokens - (last.token_id == EOS_TOKEN_ID and last.finish is FinishReason.STOP)
    return {
        "prompt_tokens": last.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": last.prompt_tokens + completion,
    }


# -- non-streaming bodies -------------------------------------------------------------------


@pytest.mark.parametrize("model", ["model-a", "model-b"])
async def test_text_completion_body(client: httpx.AsyncClient, engine: FakeEngine, model: str) -> None:
    r = await client.post("/v1/completions", json=request_body("text", model, max_tokens=100))
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("cmpl-") and body["id"] == r.headers["x-request-id"]
    assert body["object"] == "text_completion"
    assert body["model"] == model
    assert isinstance(body["created"], int) and body["created"] > 1_700_000_000
    assert body["choices"] == [{"index": 0, "text": DEFAULT_TEXT, "logprobs": None, "finish_reason": "stop"}]
    codec = package_codec(model)
    prompt_ids = codec.encode("Say hello.")
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(codec.encode(DEFAULT_TEXT)),  # as OpenAI and llama.cpp count: not the EOS
        "total_tokens": len(prompt_ids) + len(codec.encode(DEFAULT_TEXT)),
    }
    (req,) = engine.submitted
    assert req.request_id == body["id"]
    assert req.alias == model
    assert req.prompt_ids == tuple(prompt_ids)  # each alias its own tokenizer (001 §8.3)
    assert req.max_tokens == 100


@pytest.mark.parametrize("model", ["model-a", "model-b"])
async def test_chat_completion_body(client: httpx.AsyncClient, engine: FakeEngine, model: str) -> None:
    r = await client.post("/v1/chat/completions", json=request_body("chat", model))
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("chatcmpl-") and body["id"] == r.headers["x-request-id"]
    assert body["object"] == "chat.completion"
    assert body["model"] == model
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": DEFAULT_TEXT},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == expected_usage(engine)
    codec = package_codec(model)
    rendered = codec.render_chat(MESSAGES, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")  # the tokenizer's template, with the generation prompt
    (req,) = engine.submitted
    assert req.prompt_ids == tuple(codec.encode(rendered))
    assert req.max_tokens == CONTEXT_LIMIT - len(req.prompt_ids)  # chat default: up to the context limit


async def test_completion_defaults_to_16_tokens(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script(eos=False)
    r = await client.post("/v1/completions", json={"model": "model-a", "prompt": "Say hello."})
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert engine.submitted[0].max_tokens == 16
    assert r.json()["usage"]["completion_tokens"] == 16


async def test_chat_max_completion_tokens_wins_over_max_tokens(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    await client.post("/v1/chat/completions", json=request_body("chat", max_tokens=9, max_completion_tokens=3))
    assert engine.submitted[0].max_tokens == 3


async def test_token_and_single_string_list_prompts(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    ids = package_codec("model-a").encode("Say hello.")
    assert (await client.post("/v1/completions", json=request_body("text", prompt=ids))).status_code == 200
    assert (await client.post("/v1/completions", json=request_body("text", prompt=["Say hello."]))).status_code == 200
    assert engine.submitted[0].prompt_ids == engine.submitted[1].prompt_ids == tuple(ids)


async def test_sampling_and_timeout_reach_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    await client.post("/v1/completions", json=request_body("text", temperature=0, top_p=0.5, seed=7, timeout=12.5))
    (req,) = engine.submitted
    assert req.sampling == SamplingParams(temperature=0.0, top_p=0.5, seed=7)
    assert req.sampling.greedy
    assert req.timeout_s == 12.5


@pytest.mark.parametrize("kind", ["text", "chat"])
async def test_max_tokens_gives_length(client: httpx.AsyncClient, engine: FakeEngine, kind: str) -> None:
    r = await client.post(PATHS[kind], json=request_body(kind, max_tokens=5))
    body = r.json()
    codec = package_codec("model-a")
    assert text_of(kind, body) == codec.decode(codec.encode(DEFAULT_TEXT)[:5])
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("kind", ["text", "chat"])
@pytest.mark.parametrize("stream", [False, True])
async def test_eos_gives_stop_and_its_text_never_appears(
    client: httpx.AsyncClient, engine: FakeEngine, kind: str, stream: bool
) -> None:
    r = await client.post(PATHS[kind], json=request_body(kind, stream=stream))
    assert engine.streams[0].sent[-1].token_id == EOS_TOKEN_ID
    assert engine.streams[0].sent[-1].finish is FinishReason.STOP
    if stream:
        events = parse_sse(r.content)
        text, finishes = stream_text(kind, events), finish_of(events)
    else:
        text, finishes = text_of(kind, r.json()), [r.json()["choices"][0]["finish_reason"]]
    assert text == DEFAULT_TEXT
    assert "<|" not in r.text and "im_end" not in r.text
    assert finishes == ["stop"]
    assert engine.streams[0].cancel_calls == [] and engine.streams[0].finish_calls == []


async def test_multibyte_characters_are_never_split(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    text = "café ✓ 日本"
    engine.script(text=text)
    r = await client.post("/v1/completions", json=request_body("text", stream=True))
    events = parse_sse(r.content)
    pieces = [ev.json["choices"][0]["text"] for ev in events[:-1]]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


# -- streaming --------------------------------------------------------------------------------


async def test_text_stream_shape(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.post("/v1/completions", json=request_body("text", stream=True))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    events = parse_sse(r.content)
    assert events[-1] == SseEvent(None, "[DONE]")
    assert all(ev.event is None for ev in events)
    chunks = [ev.json for ev in events[:-1]]
    rid = r.headers["x-request-id"]
    for c in chunks:
        assert set(c) == {"id", "object", "created", "model", "choices"}  # no usage unless asked for
        assert (c["id"], c["object"], c["model"], c["created"]) == (
            rid,
            "text_completion",
            "model-a",
            chunks[0]["created"],
        )
        assert len(c["choices"]) == 1 and c["choices"][0]["index"] == 0
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
    assert stream_text("text", events) == DEFAULT_TEXT
    assert len(chunks) > 5  # streamed token by token, not in one piece


async def test_chat_stream_shape_first_chunk_carries_role(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.post("/v1/chat/completions", json=request_body("chat", stream=True))
    events = parse_sse(r.content)
    assert events[-1].data == "[DONE]"
    chunks = [ev.json for ev in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == r.headers["x-request-id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert stream_text("chat", events) == DEFAULT_TEXT


@pytest.mark.parametrize("kind", ["text", "chat"])
async def test_stream_include_usage_adds_a_usage_chunk(
    client: httpx.AsyncClient, engine: FakeEngine, kind: str
) -> None:
    r = await client.post(
        PATHS[kind], json=request_body(kind, stream=True, max_tokens=4, stream_options={"include_usage": True})
    )
    events = parse_sse(r.content)
    assert events[-1].data == "[DONE]"
    usage_chunk = events[-2].json
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == expected_usage(engine)
    assert usage_chunk["usage"]["completion_tokens"] == 4
    assert [ev for ev in events[:-2] if "usage" in ev.json] == []
    assert finish_of(events) == ["length"]


@pytest.mark.parametrize("kind", ["text", "chat"])
async def test_stream_include_usage_false_has_no_usage(client: httpx.AsyncClient, kind: str) -> None:
    r = await client.post(PATHS[kind], json=request_body(kind, stream=True, stream_options={"include_usage": False}))
    assert all("usage" not in ev.json for ev in parse_sse(r.content)[:-1])


# -- stop strings ---------------------------------------------------------------------------

# DEFAULT_TEXT in model-a's tokens: H|el|lo| w|or|l|d|,| the| c|al|c|u|let| s|a|y|s| |hi|.
STOP_CASES = [
    ("world", "Hello "),  # spans four tokens: " w", "or", "l", "d"
    (["nothing", "calc"], "Hello world, the "),  # a list; "calc" spans " c", "al", "c"
    (".", "Hello world, the calculet says hi"),  # the last token before EOS
    ("Hello", ""),  # the very first tokens
    ([",", " the"], "Hello world"),  # the earliest match wins
    ("e c", "Hello world, th"),  # ends mid-token: " the" then " c"
]


@pytest.mark.parametrize("kind", ["text", "chat"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("stop", "expected"), STOP_CASES)
async def test_stop_strings_cut_the_text(
    client: httpx.AsyncClient, engine: FakeEngine, kind: str, stream: bool, stop: Any, expected: str
) -> None:
    r = await client.post(
        PATHS[kind],
        json=request_body(kind, stream=stream, stop=stop, stream_options={"include_usage": True} if stream else None),
    )
    assert r.status_code == 200
    if stream:
        events = parse_sse(r.content)
        assert events[-1].data == "[DONE]"
        text, finishes = stream_text(kind, events), finish_of(events)
        assert events[-2].json["usage"] == expected_usage(engine)
    else:
        text, finishes = text_of(kind, r.json()), [r.json()["choices"][0]["finish_reason"]]
        assert r.json()["usage"] == expected_usage(engine)
    assert text == expected
    assert finishes == ["stop"]
    s = engine.streams[0]
    assert s.finish_calls == [FinishReason.STOP]  # the engine is told to stop generating...
    assert s.cancel_calls == []  # ...which is not a cancellation


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_prefix_held_back_is_released_at_the_end(
    client: httpx.AsyncClient, engine: FakeEngine, stream: bool
) -> None:
    # "hi" could start "hi!"; when the model ends instead, the held-back "hi" must still be sent.
    engine.script(text="Hello hi")
    r = await client.post("/v1/completions", json=request_body("text", stream=stream, stop=["hi!"]))
    text = stream_text("text", parse_sse(r.content)) if stream else r.json()["choices"][0]["text"]
    assert text == "Hello hi"
    assert engine.streams[0].finish_calls == []


async def test_a_stop_prefix_is_released_when_the_match_fails(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.post("/v1/completions", json=request_body("text", stream=True, stop="hi!"))
    events = parse_sse(r.content)
    assert stream_text("text", events) == DEFAULT_TEXT
    assert finish_of(events) == ["stop"]  # from EOS


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_hit_by_max_tokens_last_token(
    client: httpx.AsyncClient, engine: FakeEngine, stream: bool
) -> None:
    # The 7th token "d" completes "world" and is also the max_tokens-th: the stop string wins, as in OpenAI.
    r = await client.post("/v1/completions", json=request_body("text", stream=stream, stop="world", max_tokens=7))
    if stream:
        events = parse_sse(r.content)
        text, finishes = stream_text("text", events), finish_of(events)
    else:
        text, finishes = r.json()["choices"][0]["text"], [r.json()["choices"][0]["finish_reason"]]
    assert (text, finishes) == ("Hello ", ["stop"])


async def test_empty_stop_list_and_empty_stop_string_are_ignored(client: httpx.AsyncClient) -> None:
    stop: list[str] | str
    for stop in ([], ""):
        r = await client.post("/v1/completions", json=request_body("text", stop=stop))
        assert r.json()["choices"][0]["text"] == DEFAULT_TEXT


async def test_tenant_is_default_without_api_keys_and_never_from_user(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    await client.post("/v1/completions", json=request_body("text", user="tenant-b", tenant="tenant-b"))
    assert engine.submitted[0].tenant == "default"
