"""Sampling parameters and log-probabilities on the real engine (mock board, combined sample), through the
official ``openai`` client (issue 49 item 3).

The expected tokens and log-probabilities come from the package's own float64 reference forward
(``calctl.model.decoder.reference_logits``) with the parameters applied by ``sampling_reference`` (no calctl
sampling code), so each parameter is checked end to end: the served greedy tokens are the reference's
argmax after the penalties and the bias, and every logprob is the reference's raw log-softmax to 1e-3.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest

from calctl.model import decoder
from calctl.package.reader import load_manifest
from calctl.serving.api.logprobs import TokenNames
from calctl.serving.protocol import SamplingParams
from tests.integration.serve_harness import COMBINED, Served, golden, serving
from tests.unit.serving.sampling_reference import ref_log_softmax, ref_logits

pytestmark = pytest.mark.slow

ALIAS = "model-a"
EOS = 2
STEPS = 10
TOL = 1e-3  # the mock computes in float32; the reference in float64
MARGIN = 1e-2  # a reference top-2 gap below this could go either way in float32: the check stops there


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serving(time_scale=0.0) as s:
        yield s


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def model() -> tuple[dict[str, np.ndarray], Any]:
    m = load_manifest(COMBINED).model(ALIAS)
    return decoder.load_params(COMBINED, m.params), m.architecture


def reference(
    model: tuple[dict[str, np.ndarray], Any], prompt: list[int], s: SamplingParams, steps: int = STEPS
) -> list[tuple[int, list[float]]]:
    """Greedy (token, raw log-probabilities) per step from the float64 forward; stops at the EOS, or before a
    step whose processed top-2 margin is too thin to call."""
    params, arch = model
    seq, out = list(prompt), []
    for _ in range(steps):
        raw = decoder.reference_logits(params, arch, np.array(seq), dtype=np.float64, last_only=True)[0]
        z = np.array(ref_logits(raw, s, tuple(prompt), tuple(seq[len(prompt) :])))
        top2 = np.sort(z)[-2:]
        if top2[1] - top2[0] < MARGIN:
            break
        token = int(np.argmax(z))
        if token == EOS:
            break
        out.append((token, ref_log_softmax(raw)))
        seq.append(token)
    return out


def _prompt() -> list[int]:
    return golden(COMBINED, ALIAS)[0]


def along(model: tuple[dict[str, np.ndarray], Any], prompt: list[int], tokens: list[int]) -> list[list[float]]:
    """The float64 raw log-probabilities at each served token's position (the served tokens fed back)."""
    params, arch = model
    rows = decoder.reference_logits(params, arch, np.array(prompt + tokens), dtype=np.float64)
    return [ref_log_softmax(rows[len(prompt) - 1 + i]) for i in range(len(tokens))]


def _ids(names: TokenNames, vocab: int) -> dict[bytes, int]:
    return {names.of(i)[1]: i for i in range(vocab)}


def _check_content(
    content: list[Any], prompt: list[int], model: tuple[dict[str, np.ndarray], Any], names: TokenNames, top: int
) -> None:
    """Every entry's logprob and alternatives equal the float64 reference's; each token is the reference's
    greedy choice wherever its top-2 gap is wide enough to call."""
    ids = _ids(names, model[1].vocab_size)
    tokens = [ids[bytes(e.bytes or [])] for e in content]
    assert len(tokens) >= 4
    for entry, token, lps in zip(content, tokens, along(model, prompt, tokens), strict=True):
        assert entry.token == names.of(token)[0]
        assert abs(entry.logprob - lps[token]) < TOL
        best = sorted(range(len(lps)), key=lambda i: -lps[i])[:top]
        if lps[best[0]] - lps[best[1]] >= MARGIN:
            assert token == best[0]
        assert len(entry.top_logprobs) == top
        for alt, want in zip(entry.top_logprobs, best, strict=True):
            assert abs(alt.logprob - lps[want]) < TOL
            assert alt.token == names.of(ids[bytes(alt.bytes or [])])[0]


def test_chat_logprobs_equal_the_float64_reference(served: Served, client: openai.OpenAI, model) -> None:
    codec = served.engine.codec(ALIAS)
    messages: list[Any] = [{"role": "user", "content": "Hello board"}]
    prompt = codec.encode(codec.render_chat(messages, add_generation_prompt=True))
    r = client.chat.completions.create(
        model=ALIAS, messages=messages, temperature=0, max_tokens=STEPS, logprobs=True, top_logprobs=3
    )
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    _check_content(content, prompt, model, TokenNames(codec), 3)
    assert r.usage is not None and len(content) == r.usage.completion_tokens  # no EOS entry
    assert b"".join(bytes(e.bytes or []) for e in content).decode("utf-8", "replace") == choice.message.content
    chunks = list(
        client.chat.completions.create(
            model=ALIAS,
            messages=messages,
            temperature=0,
            max_tokens=STEPS,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
    )
    streamed = [
        e for c in chunks for ch in c.choices if ch.logprobs and ch.logprobs.content for e in ch.logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]


def test_completion_logprobs_legacy_shape_equal_the_reference(served: Served, client: openai.OpenAI, model) -> None:
    names = TokenNames(served.engine.codec(ALIAS))
    ids = _ids(names, model[1].vocab_size)
    prompt = _prompt()
    r = client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=STEPS, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert r.usage is not None and len(lp.tokens) == r.usage.completion_tokens
    # The legacy shape has token strings only; the greedy reference's tokens (its top-2 gaps are wide on this
    # prompt) name the ids.
    ref = reference(model, prompt, SamplingParams(temperature=0.0))
    assert len(ref) >= 4
    for i, (token, lps) in enumerate(ref):
        assert lp.tokens[i] == names.of(token)[0]
        assert abs(lp.token_logprobs[i] - lps[token]) < TOL
        best = sorted(range(len(lps)), key=lambda j: -lps[j])[:2]
        want = {names.of(j)[0]: lps[j] for j in best} | {names.of(token)[0]: lps[token]}
        assert set(lp.top_logprobs[i]) == set(want)
        assert all(abs(lp.top_logprobs[i][k] - v) < TOL for k, v in want.items())
    assert len(ids) == model[1].vocab_size  # every token of the vocabulary has its own bytes
    text = r.choices[0].text
    specials = {names.of(i)[0] for i in names.special}  # not in the text (as the decoder skips them)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] <= len(text)
    for piece, offset in zip(lp.tokens, lp.text_offset, strict=True):
        if not piece.startswith("bytes:") and piece not in specials:  # whole characters sit at their offset
            assert text[offset : offset + len(piece)] == piece
    stream = list(
        client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=STEPS, logprobs=2, stream=True)
    )
    parts = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens or []] == lp.tokens
    assert [o for p in parts for o in p.text_offset or []] == lp.text_offset  # offsets carry on across chunks
    assert [v for p in parts for v in p.token_logprobs or []] == lp.token_logprobs


def test_no_logprobs_unless_asked(client: openai.OpenAI) -> None:
    r = client.completions.create(model=ALIAS, prompt=_prompt(), temperature=0, max_tokens=4)
    assert r.choices[0].logprobs is None
    chat = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=4
    )
    assert chat.choices[0].logprobs is None


PENALISED = [
    SamplingParams(temperature=0.0, frequency_penalty=2.0),
    SamplingParams(temperature=0.0, presence_penalty=2.0),
    SamplingParams(temperature=0.0, repetition_penalty=2.0),
    SamplingParams(temperature=0.0, frequency_penalty=0.8, presence_penalty=-0.5, repetition_penalty=1.5),
]


def _extra(s: SamplingParams) -> dict[str, Any]:
    return {"repetition_penalty": s.repetition_penalty} if s.repetition_penalty != 1.0 else {}


@pytest.mark.parametrize("s", PENALISED, ids=["frequency", "presence", "repetition", "combined"])
def test_penalties_give_the_references_greedy_tokens(
    served: Served, client: openai.OpenAI, model, s: SamplingParams
) -> None:
    names = TokenNames(served.engine.codec(ALIAS))
    prompt = _prompt()
    want = reference(model, prompt, s, steps=16)
    assert len(want) >= 4
    plain = client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=16, logprobs=0)
    r = client.completions.create(
        model=ALIAS,
        prompt=prompt,
        temperature=0,
        max_tokens=16,
        logprobs=0,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        extra_body=_extra(s),
    )
    got = r.choices[0].logprobs
    assert got is not None and got.tokens is not None
    assert got.tokens[: len(want)] == [names.of(t)[0] for t, _ in want]
    assert plain.choices[0].logprobs is not None
    assert got.tokens != plain.choices[0].logprobs.tokens  # the parameter changed the greedy output


def test_logit_bias_bans_and_forces_tokens(client: openai.OpenAI) -> None:
    prompt = _prompt()
    plain = client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=6, logprobs=0)
    first = plain.choices[0].logprobs.tokens[0]  # type: ignore[union-attr, index]
    forced = client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=6, logit_bias={"42": 100})
    assert forced.choices[0].text == "H" * 6  # token 42 is "H" in model-a's vocabulary
    banned_first = client.completions.create(
        model=ALIAS, prompt=prompt, temperature=0, max_tokens=6, logprobs=0, logit_bias={"42": -100}
    )
    assert "H" not in banned_first.choices[0].text
    assert first is not None
    eos = client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=6, logit_bias={"2": 100})
    assert (eos.choices[0].text, eos.choices[0].finish_reason) == ("", "stop")
    ignored = client.completions.create(
        model=ALIAS, prompt=prompt, temperature=0, max_tokens=6, logit_bias={"2": 100}, extra_body={"ignore_eos": True}
    )
    assert ignored.choices[0].finish_reason == "length"
    assert ignored.usage is not None and ignored.usage.completion_tokens == 6


def test_top_k_min_p_and_top_p_narrow_a_sampled_output_to_the_greedy_one(client: openai.OpenAI) -> None:
    prompt = _prompt()
    greedy = client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=12).choices[0].text

    def sampled(seed: int, **kw: Any) -> str:
        r = client.completions.create(model=ALIAS, prompt=prompt, temperature=1.5, max_tokens=12, seed=seed, **kw)
        return r.choices[0].text

    free = {sampled(seed) for seed in range(4)}
    assert free != {greedy} and len(free) > 1  # at temperature 1.5 the samples wander, each seed its own way
    assert {sampled(seed, extra_body={"top_k": 1}) for seed in range(4)} == {greedy}
    assert {sampled(seed, extra_body={"min_p": 1.0}) for seed in range(4)} == {greedy}
    assert {sampled(seed, top_p=1e-9) for seed in range(4)} == {greedy}
    # A fixed seed repeats, with every parameter at once, streamed or not.
    kw: dict[str, Any] = {
        "top_p": 0.95,
        "frequency_penalty": 0.3,
        "presence_penalty": 0.2,
        "logit_bias": {"42": 2},
        "extra_body": {"top_k": 40, "min_p": 0.01, "repetition_penalty": 1.1},
    }
    once = sampled(123, **kw)
    assert sampled(123, **kw) == once
    streamed = client.completions.create(
        model=ALIAS, prompt=prompt, temperature=1.5, max_tokens=12, seed=123, stream=True, **kw
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == once


def test_a_refused_parameter_is_an_openai_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=ALIAS, prompt="hi", max_tokens=2, echo=True, logprobs=1)
    assert "echo" in str(bad.value)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2, logprobs=True, top_logprobs=21
        )
    assert "top_logprobs" in str(bad.value)


def test_a_temperature_too_small_to_divide_by_is_greedy(served: Served, client: openai.OpenAI) -> None:
    """vLLM's rule (below 1e-5 is 0): logits divided by 1e-310 overflowed, and the NaN draw failed in the
    engine's thread; the alias must still serve afterwards."""
    prompt = _prompt()
    greedy = client.completions.create(model=ALIAS, prompt=prompt, temperature=0, max_tokens=8).choices[0].text
    for t in (1e-310, 5e-324, 9e-6):
        r = client.completions.create(model=ALIAS, prompt=prompt, temperature=t, max_tokens=8, seed=1)
        assert r.choices[0].text == greedy
    assert served.engine.is_ready(ALIAS)
