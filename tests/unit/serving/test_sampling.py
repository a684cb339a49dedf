"""The sampler against a plain numpy reference on fixed logits: each parameter alone, all of them together,
the raw log-probabilities, and the seeded draw (issue 49 item 3).

The reference (``sampling_reference``) shares no code with ``calctl.serving.engine.sampling``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from calctl.serving.engine.sampling import (
    TokenHistory,
    log_softmax,
    processed_logits,
    request_rng,
    sample_token,
    sampling_probabilities,
    token_logprob,
)
from calctl.serving.protocol import SamplingParams
from tests.unit.serving.sampling_reference import ref_logits, ref_probabilities

V = 64
LOGITS = np.random.default_rng(49).normal(0.0, 2.0, V).astype(np.float32)
PROMPT = (3, 5, 5, 9, 17, 40)
OUTPUT = (9, 9, 9, 12, 40, 63, 12)


def _history(prompt: tuple[int, ...] = PROMPT, output: tuple[int, ...] = OUTPUT) -> TokenHistory:
    h = TokenHistory.of(prompt)
    for tok in output:
        h.add(tok)
    return h


CASES = {
    "top_k": SamplingParams(temperature=0.8, top_k=5),
    "top_k_ties": SamplingParams(temperature=1.0, top_k=2),
    "min_p": SamplingParams(temperature=0.7, min_p=0.2),
    "top_p": SamplingParams(temperature=1.3, top_p=0.6),
    "frequency_penalty": SamplingParams(temperature=1.0, frequency_penalty=1.5),
    "negative_frequency_penalty": SamplingParams(temperature=1.0, frequency_penalty=-2.0),
    "presence_penalty": SamplingParams(temperature=1.0, presence_penalty=2.0),
    "repetition_penalty": SamplingParams(temperature=1.0, repetition_penalty=1.8),
    "repetition_penalty_below_1": SamplingParams(temperature=1.0, repetition_penalty=0.5),
    "logit_bias": SamplingParams(temperature=1.0, logit_bias=((0, 100.0), (7, -100.0), (9, 3.5))),
    "combined": SamplingParams(
        temperature=0.6,
        top_p=0.9,
        top_k=12,
        min_p=0.05,
        frequency_penalty=0.7,
        presence_penalty=-0.4,
        repetition_penalty=1.3,
        logit_bias=((20, 4.0), (31, -2.5)),
    ),
}


def _logits_for(name: str) -> np.ndarray:
    if name == "top_k_ties":  # three tokens share the largest logit: vLLM keeps every tie of the k-th
        row = LOGITS.copy()
        row[[4, 11, 30]] = row.max() + 1.0
        return row
    return LOGITS


@pytest.mark.parametrize("name", list(CASES))
def test_each_parameter_matches_the_reference_distribution(name: str) -> None:
    s, logits = CASES[name], _logits_for(name)
    want_z = ref_logits(logits, s, PROMPT, OUTPUT)
    got_z = processed_logits(logits, s, _history())
    np.testing.assert_allclose(got_z, want_z, rtol=1e-12, atol=1e-12)
    want_p = ref_probabilities(want_z, s)
    got_p = sampling_probabilities(got_z, s)
    np.testing.assert_allclose(got_p, want_p, rtol=1e-9, atol=1e-12)
    assert (got_p > 0).sum() == (want_p > 0).sum()
    if name == "top_k_ties":
        assert (got_p > 0).sum() == 3
    # Every parameter here changes the distribution the default parameters give.
    plain = sampling_probabilities(LOGITS.astype(np.float64), SamplingParams(temperature=s.temperature))
    assert np.abs(got_p - plain).max() > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_the_seeded_draw_is_from_that_distribution_and_repeats(name: str) -> None:
    s, logits = dataclasses.replace(CASES[name], seed=1234), _logits_for(name)
    want_p = ref_probabilities(ref_logits(logits, s, PROMPT, OUTPUT), s)
    ref_rng = np.random.default_rng(1234)
    want = [int(ref_rng.choice(V, p=want_p)) for _ in range(40)]
    rng = request_rng(s.seed)
    got = [sample_token(logits, s, rng, _history()) for _ in range(40)]
    assert got == want
    assert all(want_p[t] > 0 for t in got)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_takes_the_argmax_of_the_penalised_and_biased_logits(name: str) -> None:
    s, logits = dataclasses.replace(CASES[name], temperature=0.0), _logits_for(name)
    want = int(np.argmax(ref_logits(logits, s, PROMPT, OUTPUT)))
    assert sample_token(logits, s, None, _history()) == want


def test_penalties_change_the_greedy_token() -> None:
    row = np.zeros(V, dtype=np.float32)
    row[9], row[10] = 5.0, 4.5  # 9 was generated three times
    greedy = SamplingParams(temperature=0.0)
    assert sample_token(row, greedy, None, _history()) == 9
    for s in (
        dataclasses.replace(greedy, frequency_penalty=0.2),
        dataclasses.replace(greedy, presence_penalty=0.6),
        dataclasses.replace(greedy, repetition_penalty=1.2),
        dataclasses.replace(greedy, logit_bias=((10, 1.0),)),
    ):
        assert sample_token(row, s, None, _history()) == 10, s


def test_frequency_and_presence_count_only_the_output_repetition_also_the_prompt() -> None:
    row = np.full(V, 1.0, dtype=np.float32)
    h = _history(prompt=(5,), output=(6, 6))
    z = processed_logits(row, SamplingParams(frequency_penalty=1.0, presence_penalty=0.5), h)
    assert (z[5], z[6], z[7]) == (1.0, 1.0 - 2 * 1.0 - 0.5, 1.0)
    z = processed_logits(row, SamplingParams(repetition_penalty=2.0), h)
    assert (z[5], z[6], z[7]) == (0.5, 0.5, 1.0)
    neg = np.full(V, -1.0, dtype=np.float32)
    assert processed_logits(neg, SamplingParams(repetition_penalty=2.0), h)[5] == -2.0


def test_default_parameters_draw_what_the_plain_sampler_drew() -> None:
    """Temperature and top_p alone draw the same token for the same seed as before these parameters existed."""
    s = SamplingParams(temperature=0.9, top_p=0.8, seed=7)
    z = LOGITS.astype(np.float64) / 0.9
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), 0.8) + 1)]
    q = np.zeros_like(p)
    q[keep] = p[keep]
    q /= q.sum()
    ref = np.random.default_rng(7)
    rng = request_rng(7)
    assert [sample_token(LOGITS, s, rng) for _ in range(30)] == [int(ref.choice(V, p=q)) for _ in range(30)]


def test_logprobs_are_the_raw_log_softmax_with_the_top_n_best_first() -> None:
    lp = LOGITS.astype(np.float64) - np.log(np.exp(LOGITS.astype(np.float64)).sum())
    got = token_logprob(LOGITS, 17, 5)
    assert got.token_id == 17 and got.logprob == pytest.approx(lp[17], abs=1e-12)
    order = np.argsort(-lp)[:5]
    assert [i for i, _ in got.top] == order.tolist()
    np.testing.assert_allclose([v for _, v in got.top], lp[order], atol=1e-12)
    assert token_logprob(LOGITS, 17, 0).top == ()
    assert len(token_logprob(LOGITS, 17, 500).top) == V


def test_logprobs_do_not_overflow_and_ties_are_ordered_by_id() -> None:
    row = np.array([1e4, 1e4, -1e4, 1e4], dtype=np.float32)
    lp = log_softmax(row)
    assert np.isfinite(lp[0]) and lp[0] == pytest.approx(-math.log(3))
    assert [i for i, _ in token_logprob(row, 2, 2).top] == [0, 1]


def test_bias_beyond_the_logits_row_is_skipped_not_a_crash() -> None:
    s = SamplingParams(temperature=0.0, logit_bias=((V + 5, 100.0),), repetition_penalty=1.5)
    assert sample_token(LOGITS, s, None, _history(prompt=(V + 1,), output=(V + 2,))) == int(np.argmax(LOGITS))


@pytest.mark.parametrize("scale", [0.01, 1.0, 8.0])  # nearly flat (the nucleus spans thousands), typical, peaked
@pytest.mark.parametrize("top_p", [1e-9, 0.3, 0.9, 0.999999])
def test_nucleus_of_a_large_row_is_the_full_sorts(scale: float, top_p: float) -> None:
    """Only the top of the row is sorted; the kept set and the seeded draws are those of a full sort."""
    row = np.random.default_rng(int(scale * 100)).normal(0, scale, 49152)
    s = SamplingParams(temperature=1.0, top_p=top_p, seed=3)
    want = ref_probabilities([float(x) for x in row], s)
    got = sampling_probabilities(row, s)
    assert ((got > 0) == (want > 0)).all()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 9.9e-6])
def test_a_temperature_below_vllms_epsilon_is_greedy_not_a_nan_draw(temperature: float) -> None:
    s = SamplingParams(temperature=temperature, top_k=3, min_p=0.5)
    assert s.greedy
    assert sample_token(LOGITS, s, None) == int(np.argmax(LOGITS))
    assert not SamplingParams(temperature=1e-5).greedy
