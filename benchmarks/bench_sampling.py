"""Benchmark: the sampler's time per token with each issue-49 parameter, against plain greedy, in one run.

Run on demand (not part of the test suite)::

    python benchmarks/bench_sampling.py [--vocab 49152] [--tokens 2000] [--prompt 512]

Times ``calctl.serving.engine.sampling`` on one lane's logits row of ``--vocab`` float32 entries (SmolLM2's
vocabulary by default), as the engine core calls it once per token per lane:

* the baseline: greedy with no parameters (an argmax of the raw row);
* greedy with ``logprobs`` (top 5): the raw log-softmax and the top-5;
* greedy with the three penalties and a 10-entry ``logit_bias`` over ``--prompt`` prompt tokens and a
  growing output (the history is the request's own, as in the engine);
* temperature sampling with ``top_p`` alone (what calctl did before issue 49), and with ``top_k``,
  ``min_p`` and the penalties on top.

Each case is timed interleaved with the baseline so host load hits both alike, and printed as microseconds
per token and the ratio to the baseline, with the load average. For scale: a SmolLM2 decode step on the mock
is milliseconds (docs/import.md), so a case's microseconds are that fraction of a token's time.

This script measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from calctl.serving.engine.sampling import TokenHistory, request_rng, sample_token, token_logprob
from calctl.serving.protocol import SamplingParams

PENALISED = SamplingParams(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.2)


def _case(vocab: int, prompt: int, s: SamplingParams) -> Callable[[np.ndarray], None]:
    """One request's sampler over successive rows (history and RNG kept across calls, as the engine does)."""
    rng = request_rng(s.seed)
    rows = np.random.default_rng(1)
    history = TokenHistory.of(rows.integers(0, vocab, prompt).tolist())

    def step(row: np.ndarray) -> None:
        token = sample_token(row, s, rng, history)
        history.add(token)
        if s.logprobs is not None:
            token_logprob(row, token, s.logprobs)

    return step


def _per_token_us(step: Callable[[np.ndarray], None], rows: np.ndarray) -> float:
    t0 = time.perf_counter()
    for row in rows:
        step(row)
    return (time.perf_counter() - t0) / len(rows) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = np.random.default_rng(0).normal(0, 3, (args.tokens, args.vocab)).astype(np.float32)
    bias = tuple((i * 97 % args.vocab, 2.0) for i in range(10))
    cases = {
        "greedy + logprobs (top 5)": SamplingParams(temperature=0.0, logprobs=5),
        "greedy + penalties + logit_bias": dataclasses.replace(PENALISED, logit_bias=bias),
        "sampled, top_p (before issue 49)": SamplingParams(temperature=0.8, top_p=0.9, seed=1),
        "sampled, top_p + top_k + min_p": SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, seed=1),
        "sampled, everything + logprobs": dataclasses.replace(
            PENALISED, temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, seed=1, logit_bias=bias, logprobs=5
        ),
    }
    plain = SamplingParams(temperature=0.0)
    print(f"vocab {args.vocab}, {args.tokens} tokens x {args.rounds} rounds, load {os.getloadavg()[0]:.2f}")
    print(f"{'case':36} {'us/token':>10} {'baseline':>10} {'ratio':>7}")
    for name, s in cases.items():
        mine, base = [], []
        for _ in range(args.rounds):  # interleaved: the same load on both
            base.append(_per_token_us(_case(args.vocab, args.prompt, plain), rows))
            mine.append(_per_token_us(_case(args.vocab, args.prompt, s), rows))
        m, b = statistics.median(mine), statistics.median(base)
        print(f"{name:36} {m:10.1f} {b:10.1f} {m / b:7.1f}")
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
