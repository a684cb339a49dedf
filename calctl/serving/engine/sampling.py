"""Sampling: one token from one lane's logits, with the request's own RNG (greedy at temperature 0).

No scheduling, no device and no request state here; the engine core calls it on its own thread.
"""

from __future__ import annotations

import numpy as np

from calctl.serving.protocol import SamplingParams


def request_rng(seed: int | None) -> np.random.Generator:
    """The request's own RNG. A client's seed is a signed 64-bit integer (OpenAI, vLLM) and numpy takes only
    non-negative ones, so it is taken modulo 2**64: one-to-one over the signed range, never a crash."""
    return np.random.default_rng(None if seed is None else seed % 2**64)


def sample_token(logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator | None) -> int:
    """Greedy at temperature 0 (no RNG needed); otherwise temperature + nucleus (top-p) sampling with the
    request's RNG."""
    if sampling.greedy:
        return int(np.argmax(logits))
    if rng is None:
        raise ValueError("sampling at a temperature above 0 needs the request's RNG")
    z = logits.astype(np.float64) / sampling.temperature
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-p)
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, sampling.top_p) + 1)]
        mask = np.zeros_like(p)
        mask[keep] = p[keep]
        p = mask / mask.sum()
    return int(rng.choice(len(p), p=p))


__all__ = ["request_rng", "sample_token"]
