"""The official ``openai`` client against uvicorn on loopback (issue 8 acceptance, here over the fake engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from calctl.serving.api.app import ApiSettings
from calctl.serving.protocol import EngineRejection, RejectCode
from tests.unit.serving_api.api_harness import ServerThread
from tests.unit.serving_api.fake_engine import DEFAULT_TEXT, FakeEngine, package_codec

KEY = "sk-alice"
SETTINGS = ApiSettings(api_keys={KEY: "tenant-a"}, admin_keys=frozenset({"adm"}))
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


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
    assert out.usage is not None and out.usage.completion_tokens == len(package_codec(model).encode(DEFAULT_TEXT)) + 1
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
