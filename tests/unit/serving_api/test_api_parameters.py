"""Every parameter OpenAI and vLLM clients send is honoured or a 400 naming it (issue 49 item 3).

The refused ones are listed here by hand with a value that asks for something, so a parameter dropped from
``schemas.REFUSED`` fails this file; the honoured ones reach the engine (the fake engine records what it was
given). Behaviour on the real engine is tests/integration/test_serve_sampling.py.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from calctl.serving.api import schemas
from calctl.serving.protocol import SamplingParams
from tests.unit.serving_api.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

TEXT = {"model": "model-a", "prompt": "hi"}
CHAT = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}]}

# Parameter -> a value that asks for something calctl does not do (both endpoints unless in ONE_ENDPOINT).
ASKING: dict[str, Any] = {
    "best_of": 2,
    "echo": True,
    "suffix": " end",
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "functions": [{"name": "f"}],
    "tool_choice": "required",
    "function_call": {"name": "f"},
    "response_format": {"type": "json_object"},
    "store": True,
    "service_tier": "flex",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high",
    "web_search_options": {"search_context_size": "low"},
    "verbosity": "low",
    "use_beam_search": True,
    "length_penalty": 0.5,
    "min_tokens": 4,
    "stop_token_ids": [7],
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "prompt_logprobs": 1,
    "allowed_token_ids": [5, 6],
    "bad_words": ["no"],
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "guided_choice": ["a", "b"],
    "guided_grammar": "root ::= 'a'",
    "structured_outputs": {"regex": "a"},
    "truncate_prompt_tokens": 8,
    "priority": 1,
    "return_tokens_as_token_ids": True,
    "logits_processors": ["x"],
    "chat_template": "{{ messages }}",
    "chat_template_kwargs": {"enable_thinking": True},
    "continue_final_message": True,
    "documents": [{"text": "d"}],
    "mm_processor_kwargs": {"x": 1},
}
ONE_ENDPOINT: list[tuple[str, str, Any]] = [
    ("/v1/completions", "add_special_tokens", False),
    ("/v1/chat/completions", "add_special_tokens", True),
    ("/v1/chat/completions", "add_generation_prompt", False),
    # the chat endpoint's names sent to the completions one: ignored, the client would not get what it asked
    ("/v1/completions", "max_completion_tokens", 3),
    ("/v1/completions", "top_logprobs", 2),
]
REFUSED = [
    (path, name, value) for name, value in ASKING.items() for path in ("/v1/completions", "/v1/chat/completions")
]


def _body(path: str) -> dict[str, Any]:
    return dict(CHAT if "chat" in path else TEXT)


def test_every_refused_parameter_is_in_this_audit() -> None:
    assert set(schemas.REFUSED) == set(ASKING)
    assert {n for _, n, _ in ONE_ENDPOINT} == set(schemas.REFUSED_CHAT) | set(schemas.REFUSED_COMPLETION)


@pytest.mark.parametrize(("path", "name", "value"), REFUSED + ONE_ENDPOINT, ids=lambda x: str(x)[:24])
async def test_a_parameter_calctl_cannot_honour_is_400_naming_it(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, name: str, value: Any
) -> None:
    r = await client.post(path, json={**_body(path), name: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (name, "unsupported_parameter")
    assert name in err["message"]
    assert engine.submitted == []


# The values that ask for nothing: what client libraries send by default.
NOTHING: list[tuple[str, Any]] = [
    ("best_of", 1),
    ("echo", False),
    ("suffix", None),
    ("tools", []),
    ("tool_choice", "none"),
    ("tool_choice", "auto"),
    ("response_format", {"type": "text"}),
    ("store", False),
    ("service_tier", "auto"),
    ("modalities", ["text"]),
    ("use_beam_search", False),
    ("length_penalty", 1.0),
    ("min_tokens", 0),
    ("stop_token_ids", []),
    ("skip_special_tokens", True),
    ("priority", 0),
    ("chat_template_kwargs", {}),
    ("user", "someone"),
    ("metadata", {"k": "v"}),
    ("parallel_tool_calls", True),
    ("stream_options", {"include_usage": False}),  # without stream: asks for nothing
    ("stream_options", {}),
]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("name", "value"), NOTHING, ids=lambda x: str(x)[:24])
async def test_a_value_that_asks_for_nothing_is_accepted(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, name: str, value: Any
) -> None:
    r = await client.post(path, json={**_body(path), name: value})
    assert r.status_code == 200, r.text
    assert engine.submitted[0].sampling == SamplingParams()


HONOURED: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"top_k": 5}, {"top_k": 5}),
    ({"top_k": -1}, {"top_k": -1}),
    ({"min_p": 0.1}, {"min_p": 0.1}),
    ({"frequency_penalty": 0.5}, {"frequency_penalty": 0.5}),
    ({"presence_penalty": -1}, {"presence_penalty": -1.0}),
    ({"repetition_penalty": 1.2}, {"repetition_penalty": 1.2}),
    ({"logit_bias": {"7": 5, "300": -100}}, {"logit_bias": ((7, 5.0), (300, -100.0))}),
    ({"temperature": 0.5, "top_p": 0.9, "seed": -3}, {"temperature": 0.5, "top_p": 0.9, "seed": -3}),
]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("sent", "want"), HONOURED, ids=lambda x: str(x)[:30])
async def test_a_sampling_parameter_reaches_the_engine(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, sent: dict[str, Any], want: dict[str, Any]
) -> None:
    r = await client.post(path, json={**_body(path), **sent})
    assert r.status_code == 200, r.text
    got = engine.submitted[0].sampling
    assert {k: getattr(got, k) for k in want} == want
    assert got != SamplingParams()


@pytest.mark.parametrize(
    ("path", "sent", "want"),
    [
        ("/v1/completions", {"logprobs": 0}, 0),
        ("/v1/completions", {"logprobs": 5}, 5),
        ("/v1/completions", {"logprobs": None}, None),
        ("/v1/completions", {"logprobs": False}, None),
        ("/v1/chat/completions", {"logprobs": True}, 0),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 20}, 20),
        ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}, None),
        ("/v1/chat/completions", {"logprobs": None}, None),
    ],
)
async def test_logprobs_reach_the_engine_as_a_count(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, sent: dict[str, Any], want: int | None
) -> None:
    r = await client.post(path, json={**_body(path), **sent})
    assert r.status_code == 200, r.text
    assert engine.submitted[0].sampling.logprobs == want


async def test_ignore_eos_reaches_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    assert (await client.post("/v1/completions", json={**TEXT, "ignore_eos": True})).status_code == 200
    assert (await client.post("/v1/completions", json={**TEXT, "ignore_eos": None})).status_code == 200
    assert [g.ignore_eos for g in engine.submitted] == [True, False]


@pytest.mark.parametrize(
    ("sent", "words"),
    [
        ({"min_p": 2}, ["min_p", "[0, 1]", "2"]),
        ({"top_k": -5}, ["top_k", "-1", "-5"]),
        ({"frequency_penalty": 3}, ["frequency_penalty", "[-2, 2]"]),
        ({"presence_penalty": -2.5}, ["presence_penalty", "[-2, 2]"]),
        ({"repetition_penalty": 0}, ["repetition_penalty", "(0, 2]"]),
        ({"logit_bias": {"5": 150}}, ["logit_bias[5]", "[-100, 100]", "150"]),
        ({"logit_bias": {"384": 1}}, ["384", "vocabulary", "model-a"]),
        ({"logprobs": 50}, ["logprobs", "[0, 20]"]),
    ],
)
async def test_the_message_names_the_parameter_and_its_range(
    client: httpx.AsyncClient, sent: dict[str, Any], words: list[str]
) -> None:
    r = await client.post("/v1/completions", json={**TEXT, **sent})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert all(w in msg for w in words), msg


async def test_top_logprobs_without_logprobs_says_so(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json={**CHAT, "top_logprobs": 2})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "top_logprobs" and "logprobs" in err["message"]


@pytest.mark.parametrize(
    ("name", "value", "instead"), [("max_completion_tokens", 3, "max_tokens"), ("top_logprobs", 2, "logprobs")]
)
async def test_a_chat_parameter_sent_to_completions_names_the_one_it_takes(
    client: httpx.AsyncClient, engine: FakeEngine, name: str, value: int, instead: str
) -> None:
    """Ignored, ``max_completion_tokens: 3`` gave 16 tokens and ``top_logprobs: 2`` no log-probabilities."""
    r = await client.post("/v1/completions", json={**TEXT, name: value})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == name and instead in err["message"], err
    assert engine.submitted == []
    ok = await client.post("/v1/completions", json={**TEXT, name: None})
    assert ok.status_code == 200, ok.text
