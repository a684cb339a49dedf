"""The text path with a real byte-level BPE tokenizer (issue 17 item 3, built here with ``tokenizers``).

The sample package's byte tokenizer never splits a character across tokens in a way a real model's does, so
these tests train a small BPE whose merges cover ASCII words only: every accented letter, CJK character and
emoji then really is two to four byte tokens. Through the HTTP layer (the fake engine streams the tokens the
model would), the server must: render the messages with the model's own chat template, stop at EOS with
``finish_reason: "stop"``, stream only valid UTF-8 (hold a split character until complete), find stop strings
across token boundaries, and count the model's tokens in ``usage``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from calctl.serving.protocol import FinishReason
from calctl.serving.text import IncrementalDetokenizer, StopMatcher, TextCodec
from tests.unit.serving_api import fake_engine
from tests.unit.serving_api.api_harness import parse_sse
from tests.unit.serving_api.fake_engine import EOS_TOKEN_ID, FakeEngine

pytestmark = pytest.mark.anyio

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2: <|im_end|> is EOS (fake_engine)
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, the calculet says hi", "stop here now"] * 20
TEXT = "Café au lait, 日本語 and 🙂 emoji: naïve façade."


def bpe_codec() -> TextCodec:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.token_to_id("<|im_end|>") == EOS_TOKEN_ID
    return TextCodec(
        tok, CHATML, EOS_TOKEN_ID, special_ids=frozenset({0, 1, 2}), special_tokens={"eos_token": SPECIALS[2]}
    )


@pytest.fixture
def codec(monkeypatch: pytest.MonkeyPatch) -> TextCodec:
    c = bpe_codec()
    monkeypatch.setitem(fake_engine._CODECS, "model-a", c)
    return c


def test_the_tokenizer_really_splits_characters(codec: TextCodec) -> None:
    ids = codec.encode(TEXT)
    pieces = [codec.decode([i]) for i in ids]
    assert sum("\ufffd" in p for p in pieces) >= 6  # many tokens are part of a character
    assert codec.decode(ids) == TEXT


def test_deltas_are_whole_characters_and_add_up(codec: TextCodec) -> None:
    ids = codec.encode(TEXT)
    detok = IncrementalDetokenizer(codec, context=codec.encode("Say: "))
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert sum(d == "" for d in deltas) >= 6  # held while a character was incomplete


def test_a_character_cut_off_by_the_end_of_output_is_dropped_not_sent_as_u_fffd(codec: TextCodec) -> None:
    ids = codec.encode(TEXT)
    pieces = [codec.decode([i]) for i in ids]
    cut = next(
        n for n in range(1, len(ids)) if pieces[n - 1].endswith("\ufffd") and codec.decode(ids[:n]).endswith("\ufffd")
    )
    detok = IncrementalDetokenizer(codec, context=codec.encode("Say: "))
    deltas = [detok.push(i) for i in ids[:cut]] + [detok.flush()]  # max_tokens ends inside a character
    text = "".join(deltas)
    assert "\ufffd" not in text, deltas
    assert TEXT.startswith(text) and len(text) < len(TEXT)


def _stream_texts(events: list[Any]) -> list[str]:
    out = []
    for ev in events:
        if ev.data == "[DONE]" or not ev.json["choices"]:
            continue
        c = ev.json["choices"][0]
        out.append(c["delta"].get("content") or "" if "delta" in c else c["text"])
    return out


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_stream_is_valid_utf8_ends_at_eos_with_stop_and_counts_model_tokens(
    client: httpx.AsyncClient, engine: FakeEngine, codec: TextCodec, path: str
) -> None:
    engine.script(text=TEXT, eos=True)
    body: dict[str, Any] = {"model": "model-a", "stream": True, "stream_options": {"include_usage": True}}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Say it in French."}]
    else:
        body |= {"prompt": "Say it in French.", "max_tokens": 100}
    r = await client.post(path, json=body)
    assert r.status_code == 200
    raw = r.content
    raw.decode("utf-8")  # strict: the wire is valid UTF-8
    events = parse_sse(r.text)
    texts = _stream_texts(events)
    assert "".join(texts) == TEXT and "<|im_end|>" not in "".join(texts)
    assert all("\ufffd" not in t for t in texts)
    finishes = [ev.json["choices"][0]["finish_reason"] for ev in events if ev.data != "[DONE]" and ev.json["choices"]]
    assert finishes[-1] == "stop"
    usage = next(ev.json["usage"] for ev in events if ev.data != "[DONE]" and ev.json.get("usage"))
    sent = engine.submitted[0]
    assert usage["prompt_tokens"] == len(sent.prompt_ids)
    assert usage["completion_tokens"] == len(codec.encode(TEXT))  # the text's tokens, not the EOS that ended it


async def test_chat_uses_the_models_own_template_compiled_once(
    client: httpx.AsyncClient, engine: FakeEngine, codec: TextCodec
) -> None:
    template = codec._template
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüß dich 🙂"}]
    for _ in range(2):
        r = await client.post("/v1/chat/completions", json={"model": "model-a", "messages": messages})
        assert r.status_code == 200
    want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGrüß dich 🙂<|im_end|>\n<|im_start|>assistant\n"
    assert [s.prompt_ids for s in engine.submitted] == [tuple(codec.encode(want))] * 2
    assert codec._template is template  # compiled at load, not per request


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("stop", ["日本", "lait, 日", "🙂 emo", "façade."])
async def test_stop_strings_across_token_boundaries(
    client: httpx.AsyncClient, engine: FakeEngine, codec: TextCodec, stream: bool, stop: str
) -> None:
    ids = codec.encode(TEXT)
    # The stop string spans tokens: no single token's text contains it.
    assert not any(stop in codec.decode([i]) for i in ids)
    engine.script(text=TEXT, eos=True)
    r = await client.post(
        "/v1/completions",
        json={"model": "model-a", "prompt": "Say it.", "max_tokens": 100, "stop": [stop], "stream": stream},
    )
    assert r.status_code == 200
    want = TEXT[: TEXT.index(stop)]
    if stream:
        events = parse_sse(r.text)
        texts = _stream_texts(events)
        assert "".join(texts) == want and all("\ufffd" not in t for t in texts)
        assert [ev.json["choices"][0]["finish_reason"] for ev in events if ev.data != "[DONE]" and ev.json["choices"]][
            -1
        ] == "stop"
    else:
        doc = r.json()
        assert doc["choices"][0]["text"] == want and doc["choices"][0]["finish_reason"] == "stop"
    s = engine.streams[0]
    assert s.finish_calls == [FinishReason.STOP] and s.cancel_calls == []  # a real stop, not a cancel


def test_stop_matcher_holds_a_prefix_split_mid_character() -> None:
    m = StopMatcher(["語 and"])
    assert m.feed("日本") == ("日本", False)
    assert m.feed("語 a") == ("", False)  # could be the start of the stop string
    assert m.feed("nd") == ("", True)


def test_a_template_that_raises_is_a_400_naming_messages() -> None:
    c = TextCodec(bpe_codec().tokenizer, "{{ raise_exception('only user messages') }}", EOS_TOKEN_ID)
    with pytest.raises(ValueError, match="only user messages"):
        c.render_chat([{"role": "user", "content": "x"}])


#: Cheap for a short chat (what validate's TOK005 probes), over the step bound for a long one: about 150,000 steps a message.
PER_MESSAGE_LOOP = (
    "{% for m in messages %}{% for i in range(50000) %}{% endfor %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_a_template_costly_for_these_messages_answers_400_not_a_stalled_worker(
    client: httpx.AsyncClient, engine: FakeEngine, codec: TextCodec
) -> None:
    from calctl.package.chat_template import probe

    assert probe(PER_MESSAGE_LOOP) is None  # validate accepts it
    costly = TextCodec(codec.tokenizer, PER_MESSAGE_LOOP, EOS_TOKEN_ID, special_ids=codec.special_ids)
    fake_engine._CODECS["model-a"] = costly
    messages = [{"role": "user", "content": f"m{i}"} for i in range(20)]
    r = await client.post("/v1/chat/completions", json={"model": "model-a", "messages": messages})
    assert r.status_code == 400, r.text
    assert "too costly" in r.json()["error"]["message"] and "1,000,000 steps" in r.json()["error"]["message"]
    r = await client.post("/v1/chat/completions", json={"model": "model-a", "messages": messages[:2]})
    assert r.status_code == 200
    assert not engine.submitted[1:]  # the refused request never reached the engine


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * 10**9 }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "{{ '{:>999999999}'.format('x') }}",
    ],
)
def test_rendering_at_serve_time_is_bounded_like_the_importers(codec: TextCodec, template: str) -> None:
    from calctl.serving.text import ChatTemplateError

    costly = TextCodec(codec.tokenizer, template, EOS_TOKEN_ID)
    with pytest.raises(ChatTemplateError, match="too costly"):
        costly.render_chat([{"role": "user", "content": "hi"}])
