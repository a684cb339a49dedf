"""A plain reference of vLLM's sampling, for the sampler's tests and the served engine's.

Written the way vLLM's torch code reads (``apply_penalties``, ``MinPLogitsProcessor``, ``apply_top_k_top_p``
with its ascending-order top-p mask), element by element in Python floats, so it shares no code with
``calctl.serving.engine.sampling``.
"""

from __future__ import annotations

import math

import numpy as np

from calctl.serving.protocol import SamplingParams


def ref_logits(logits: np.ndarray, s: SamplingParams, prompt: tuple[int, ...], output: tuple[int, ...]) -> list[float]:
    """vLLM's order: logit_bias, then repetition (prompt + output), frequency and presence (output)."""
    z = [float(x) for x in logits]
    for tok, bias in s.logit_bias:
        z[tok] += bias
    for tok in set(prompt) | set(output):
        z[tok] = z[tok] / s.repetition_penalty if z[tok] > 0 else z[tok] * s.repetition_penalty
    for tok in set(output):
        z[tok] -= s.frequency_penalty * output.count(tok)
        z[tok] -= s.presence_penalty
    return z


def ref_probabilities(z: list[float], s: SamplingParams) -> np.ndarray:
    """Temperature, then min_p, then top_k, then top_p (vLLM v1's ``Sampler.sample``)."""
    t = [x / s.temperature for x in z]

    def softmax(xs: list[float]) -> list[float]:
        m = max(xs)
        e = [math.exp(x - m) if x != -math.inf else 0.0 for x in xs]
        total = math.fsum(e)
        return [x / total for x in e]

    if s.min_p > 0:
        p = softmax(t)
        floor = s.min_p * max(p)
        t = [x if p[i] >= floor else -math.inf for i, x in enumerate(t)]
    if s.top_k > 0:
        kth = sorted(t, reverse=True)[s.top_k - 1]
        t = [x if x >= kth else -math.inf for x in t]
    if s.top_p < 1.0:
        p = softmax(t)
        ascending = sorted(range(len(t)), key=lambda i: p[i])
        cum = 0.0
        for i in ascending[:-1]:  # the most likely token is always kept
            cum += p[i]
            if cum <= 1 - s.top_p:
                t[i] = -math.inf
    return np.array(softmax(t))


def ref_log_softmax(logits: np.ndarray) -> list[float]:
    """float64 log-probabilities, one log-sum-exp in Python's math."""
    z = [float(x) for x in logits]
    m = max(z)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in z))
    return [x - lse for x in z]
