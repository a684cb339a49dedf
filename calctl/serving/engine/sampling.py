"""Sampling: one token from one lane's logits, with the request's own RNG (greedy at temperature 0).

The order is vLLM v1's (``vllm/v1/sample/sampler.py``), so a client gets the token vLLM would pick from the
same logits:

1. on the raw logits, in float64: ``logit_bias`` (added), then the penalties — ``repetition_penalty`` over
   the prompt's and the output's tokens (a positive logit divided by it, a negative one multiplied: vLLM and
   Hugging Face), ``frequency_penalty`` times each output token's count and ``presence_penalty`` once per
   output token seen (OpenAI; over the generated tokens only);
2. greedy (temperature 0) takes the argmax of those logits: top-k, top-p and min-p never change an argmax;
3. otherwise divide by the temperature, then ``min_p`` (drop tokens whose probability is below ``min_p``
   times the top one's), ``top_k`` (keep the ``k`` largest; ties with the k-th kept, as vLLM), ``top_p``
   (the smallest set from the top whose mass reaches ``top_p``), and draw with the request's RNG.

Log-probabilities (:func:`token_logprob`) are of the raw logits, before any of the above: vLLM's default
``logprobs_mode`` (``raw_logprobs``), what an accuracy harness compares against the model itself.

No scheduling, no device and no request state here beyond :class:`TokenHistory`, which the caller keeps per
request; the engine core calls this on its own thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from calctl.serving.protocol import SamplingParams, TokenLogprob


def request_rng(seed: int | None) -> np.random.Generator:
    """The request's own RNG. A client's seed is a signed 64-bit integer (OpenAI, vLLM) and numpy takes only
    non-negative ones, so it is taken modulo 2**64: one-to-one over the signed range, never a crash."""
    return np.random.default_rng(None if seed is None else seed % 2**64)


@dataclass
class TokenHistory:
    """The tokens one request's penalties look at: the prompt's distinct ids and each output token's count."""

    prompt: np.ndarray  # distinct prompt token ids, int64
    counts: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, prompt_ids: Iterable[int]) -> TokenHistory:
        return cls(np.unique(np.fromiter(prompt_ids, dtype=np.int64)))

    def add(self, token_id: int) -> None:
        self.counts[token_id] = self.counts.get(token_id, 0) + 1


def uses_history(s: SamplingParams) -> bool:
    """Whether ``s`` looks at the tokens seen so far (a caller keeps a :class:`TokenHistory` only then)."""
    return s.frequency_penalty != 0.0 or s.presence_penalty != 0.0 or s.repetition_penalty != 1.0


def _changes_logits(s: SamplingParams) -> bool:
    return bool(s.logit_bias) or uses_history(s)


def processed_logits(logits: np.ndarray, s: SamplingParams, history: TokenHistory | None) -> np.ndarray:
    """Step 1 above: float64 logits after ``logit_bias`` and the penalties (a copy; ``logits`` is untouched).

    Token ids beyond the row (a tokenizer larger than the model's output) are skipped: nothing to bias."""
    z = np.array(logits, dtype=np.float64)
    vocab = z.shape[0]
    if s.logit_bias:
        ids = np.array([i for i, _ in s.logit_bias], dtype=np.int64)
        bias = np.array([b for _, b in s.logit_bias], dtype=np.float64)
        keep = ids < vocab
        z[ids[keep]] += bias[keep]
    if history is None or not uses_history(s):
        return z
    out_ids = np.fromiter(history.counts.keys(), dtype=np.int64, count=len(history.counts))
    out_counts = np.fromiter(history.counts.values(), dtype=np.float64, count=len(history.counts))
    keep = out_ids < vocab
    out_ids, out_counts = out_ids[keep], out_counts[keep]
    if s.repetition_penalty != 1.0:
        seen = np.union1d(history.prompt[history.prompt < vocab], out_ids)
        row = z[seen]
        z[seen] = np.where(row > 0, row / s.repetition_penalty, row * s.repetition_penalty)
    if out_ids.size:
        z[out_ids] -= s.frequency_penalty * out_counts + s.presence_penalty
    return z


def _softmax(z: np.ndarray) -> np.ndarray:
    p = np.exp(z - z.max())
    return p / p.sum()


def sampling_probabilities(z: np.ndarray, s: SamplingParams) -> np.ndarray:
    """Step 3 above without the draw: the distribution a token is drawn from (float64, sums to 1)."""
    z = z / s.temperature
    if s.min_p > 0.0:
        p = _softmax(z)
        z = np.where(p < s.min_p * p.max(), -np.inf, z)
    if 0 < s.top_k < z.shape[0]:
        kth = np.partition(z, z.shape[0] - s.top_k)[z.shape[0] - s.top_k]
        z = np.where(z < kth, -np.inf, z)
    p = _softmax(z)
    if s.top_p < 1.0:
        keep = _nucleus(p, s.top_p)
        mask = np.zeros_like(p)
        mask[keep] = p[keep]
        p = mask / mask.sum()
    return p


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The ids of the smallest set, most likely first, whose probability reaches ``top_p``.

    Only the most likely ``k`` tokens are sorted (``k`` growing until their mass reaches ``top_p``): sorting a
    49152-entry row took ~5 ms a token, the top 64 take microseconds. The prefix sums are the full sort's, so
    the set is the one a full sort gives."""
    n = p.shape[0]
    k = min(n, 64)
    while True:
        cand = np.argpartition(-p, k - 1)[:k] if k < n else np.arange(n)
        order = cand[np.argsort(-p[cand], kind="stable")]
        cum = np.cumsum(p[order])
        if k == n or cum[-1] >= top_p:
            return order[: int(np.searchsorted(cum, top_p) + 1)]
        k = min(n, k * 4)


def sample_token(
    logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator | None, history: TokenHistory | None = None
) -> int:
    """One token id from one lane's logits (steps 1-3 above); ``history`` is needed for the penalties only."""
    z = processed_logits(logits, sampling, history) if _changes_logits(sampling) else logits
    if sampling.greedy:
        return int(np.argmax(z))
    if rng is None:
        raise ValueError("sampling at a temperature above 0 needs the request's RNG")
    p = sampling_probabilities(np.asarray(z, dtype=np.float64), sampling)
    return int(rng.choice(len(p), p=p))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of a logits row (log-sum-exp shifted by the maximum, so nothing overflows)."""
    z = np.asarray(logits, dtype=np.float64)
    shifted = z - z.max()
    return shifted - np.log(np.exp(shifted).sum())


def token_logprob(logits: np.ndarray, token_id: int, top: int) -> TokenLogprob:
    """``token_id``'s log-probability under the raw logits and the ``top`` most likely tokens (best first,
    equal log-probabilities by ascending id, so the list is the same on every run)."""
    lp = log_softmax(logits)
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        n = min(top, lp.shape[0])
        nth = np.partition(-lp, n - 1)[n - 1]  # the n-th largest; every token tied with it is a candidate
        cand = np.flatnonzero(-lp <= nth)
        ordered = sorted(cand.tolist(), key=lambda i: (-lp[i], i))[:n]
        best = tuple((int(i), float(lp[i])) for i in ordered)
    return TokenLogprob(int(token_id), float(lp[token_id]), best)


__all__ = [
    "TokenHistory",
    "log_softmax",
    "processed_logits",
    "request_rng",
    "sample_token",
    "sampling_probabilities",
    "token_logprob",
    "uses_history",
]
