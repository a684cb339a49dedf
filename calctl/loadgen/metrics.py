"""Serving metrics of a phase, and the isolated-vs-joint comparison of 001 §13.2.

Per model and phase (:func:`summarize`):

* TTFT, TPOT ``= (latency - TTFT) / (tokens - 1)``, ITL and E2E at P50/P90/P99,
  over successful requests;
* throughput: completion tokens of successful requests per second and
  successful requests per second, over the phase's wall time (first arrival
  window start to the last end);
* success rate, outcomes by class, and goodput: requests per second that
  succeeded *and* met every SLO given (``--slo-ttft``, ``--slo-tpot``).

Isolated vs joint (:func:`compare`), from **time windows** of equal length over
each phase's arrival period (the first window is dropped as ramp-up, the tail
after the last arrival is not steady state). A window's rate is the completion
tokens of successful requests *delivered* in it (each of a request's ``n`` text
chunks counts ``tokens / n``), so a server that cannot keep up shows its real
delivery rate, not the offered one. Because every phase
replays the same seeded workload of each model from the same start, window
``k`` of every phase carries the same offered work, and the statistics are
**paired bootstraps over windows**:

* ``throughput_efficiency = sum_k (A_joint + B_joint) / sum_k (A_iso + B_iso)``
  (joint tokens/s over the sum of isolated tokens/s, 001 §13.2);
* ``overlap_ratio = 1 - T_joint / T_serial``, where ``T_serial`` is the time
  the tokens served jointly would take at the isolated rates, one model after
  the other: ``1 - 1 / (A_joint/A_iso + B_joint/B_iso)``. 0 means the joint
  run was no faster than serial, 0.5 that two models ran fully in parallel.

This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calctl.checks.stats import Estimate, Percentiles, bootstrap, percentiles
from calctl.loadgen.client import RequestRecord
from calctl.serving.outcomes import RequestOutcome


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        if self.ttft_s is not None and (r.ttft is None or r.ttft > self.ttft_s):
            return False
        return not (self.tpot_s is not None and r.tpot is not None and r.tpot > self.tpot_s)

    @property
    def given(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None


@dataclass(frozen=True)
class ModelStats:
    alias: str
    requests: int
    succeeded: int
    outcomes: dict[str, int]
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2e: Percentiles
    completion_tokens: int
    wall_s: float
    tokens_per_s: float | None
    requests_per_s: float | None
    goodput_rps: float | None  # None when no SLO was given
    slo_attainment: float | None
    offered_tokens_per_s: float | None = None  # sum of max_tokens of the phase's requests / arrival period
    delivered_tokens_per_s: float | None = None  # tokens delivered during the arrival period / its length

    @property
    def success_rate(self) -> float | None:
        return None if self.requests == 0 else self.succeeded / self.requests

    def document(self) -> dict[str, Any]:
        def p(x: Percentiles) -> dict[str, float | None]:
            return {"p50": x.p50, "p90": x.p90, "p99": x.p99, "mean": x.mean, "count": x.count}

        return {
            "alias": self.alias,
            "requests": self.requests,
            "succeeded": self.succeeded,
            "success_rate": self.success_rate,
            "outcomes": self.outcomes,
            "ttft_s": p(self.ttft),
            "tpot_s": p(self.tpot),
            "itl_s": p(self.itl),
            "e2e_s": p(self.e2e),
            "completion_tokens": self.completion_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "goodput_rps": self.goodput_rps,
            "slo_attainment": self.slo_attainment,
            "offered_tokens_per_s": self.offered_tokens_per_s,
            "delivered_tokens_per_s": self.delivered_tokens_per_s,
            "saturated": saturated(self),
            "refused_all": refused_all(self),
        }


def summarize(
    alias: str,
    records: Sequence[RequestRecord],
    *,
    t0: float,
    slo: Slo,
    duration_s: float | None = None,
    offered_tokens: int | None = None,
) -> ModelStats:
    """``duration_s`` (the arrival period) and ``offered_tokens`` (sum of ``max_tokens``) give the offered and
    delivered token rates over the arrival period, from which :func:`saturated` tells whether the load exceeded
    what the model served."""
    ok = [r for r in records if r.ok]
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
    ends = [r.end for r in records if r.end is not None]
    wall = (max(ends) - t0) if ends else 0.0
    tokens = sum(r.tokens for r in ok)
    itls = [x for r in ok for x in r.itls()]
    met = sum(1 for r in records if slo.met(r)) if slo.given else None
    return ModelStats(
        alias=alias,
        requests=len(records),
        succeeded=len(ok),
        outcomes=outcomes,
        ttft=percentiles([r.ttft for r in ok if r.ttft is not None]),
        tpot=percentiles([r.tpot for r in ok if r.tpot is not None]),
        itl=percentiles(itls),
        e2e=percentiles([r.e2e for r in ok if r.e2e is not None]),
        completion_tokens=tokens,
        wall_s=wall,
        tokens_per_s=tokens / wall if wall > 0 else None,
        requests_per_s=len(ok) / wall if wall > 0 else None,
        goodput_rps=(met / wall if wall > 0 else None) if met is not None else None,
        slo_attainment=(met / len(records) if records else None) if met is not None else None,
        offered_tokens_per_s=offered_tokens / duration_s if duration_s and offered_tokens is not None else None,
        delivered_tokens_per_s=_delivered(records, t0, duration_s) if duration_s else None,
    )


def _delivered(records: Sequence[RequestRecord], t0: float, duration_s: float) -> float:
    total = 0.0
    for r in records:
        if r.ok and r.token_times and r.tokens > 0:
            w = r.tokens / len(r.token_times)
            total += w * sum(1 for t in r.token_times if t < t0 + duration_s)
    return total / duration_s


def default_window(duration_s: float) -> float:
    """Ten windows over the arrival period, at least 0.25 s each."""
    return max(0.25, duration_s / 10.0)


def window_rates(records: Sequence[RequestRecord], *, t0: float, duration_s: float, window_s: float) -> np.ndarray:
    """Tokens/s of successful requests per window over [t0 + window, t0 + duration): the steady state."""
    n = int(duration_s // window_s)
    counts = np.zeros(max(n, 0), dtype=np.float64)
    for r in records:
        if not r.ok or not r.token_times or r.tokens <= 0:
            continue
        w = r.tokens / len(r.token_times)
        for t in r.token_times:
            k = int((t - t0) // window_s)
            if 0 <= k < n:
                counts[k] += w
    return counts[1:] / window_s if n > 1 else np.zeros(0)


@dataclass(frozen=True)
class Comparison:
    """001 §13.2 over paired windows: A and B isolated against A+B joint."""

    throughput_efficiency: Estimate
    overlap_ratio: Estimate
    windows: int
    window_s: float
    rates: dict[str, list[float]]  # per series: tokens/s per window (for the picture)

    def document(self) -> dict[str, Any]:
        return {
            "throughput_efficiency": self.throughput_efficiency.as_dict(),
            "overlap_ratio": self.overlap_ratio.as_dict(),
            "windows": self.windows,
            "window_s": self.window_s,
            "method": "paired bootstrap over steady-state time windows (same seeded workload per model in every phase; "
            "first window dropped as ramp-up), 2000 resamples, 95 % percentile interval",
            "rates_tokens_per_s": self.rates,
        }


def _efficiency(m: np.ndarray) -> float:
    iso = m[:, 0].sum() + m[:, 1].sum()
    return float((m[:, 2].sum() + m[:, 3].sum()) / iso) if iso > 0 else float("nan")


def _overlap(m: np.ndarray) -> float:
    a, b = m[:, 0].sum(), m[:, 1].sum()
    if a <= 0 or b <= 0:
        return float("nan")
    speedup = m[:, 2].sum() / a + m[:, 3].sum() / b  # = T_serial / T_joint for the jointly served tokens
    return float(1.0 - 1.0 / speedup) if speedup > 0 else float("nan")


def compare(
    a_iso: np.ndarray, b_iso: np.ndarray, a_joint: np.ndarray, b_joint: np.ndarray, *, window_s: float, seed: int = 0
) -> Comparison:
    n = min(len(a_iso), len(b_iso), len(a_joint), len(b_joint))
    m = np.stack([a_iso[:n], b_iso[:n], a_joint[:n], b_joint[:n]], axis=1) if n else np.zeros((0, 4))
    rows = m.tolist()  # rows are windows: the paired bootstrap resamples them together
    eff = bootstrap(rows, _efficiency, seed=seed) if n else Estimate(None, None, None, 0)
    ovl = bootstrap(rows, _overlap, seed=seed + 1) if n else Estimate(None, None, None, 0)
    rates = {
        "a_isolated": a_iso.tolist(),
        "b_isolated": b_iso.tolist(),
        "a_joint": a_joint.tolist(),
        "b_joint": b_joint.tolist(),
    }
    return Comparison(eff, ovl, n, window_s, rates)


def degradation(iso: float | None, joint: float | None) -> float | None:
    """joint / isolated - 1 (0.25 = 25 % worse)."""
    if iso is None or joint is None or iso <= 0:
        return None
    return joint / iso - 1.0


#: Delivered below this share of the offered token rate during the arrival period: the model could not keep up.
SATURATION_SHARE = 0.85


#: Outcomes that are the server refusing a request before any work, with their HTTP status.
REFUSALS = {
    RequestOutcome.INVALID.value: 400,
    RequestOutcome.NOT_FOUND.value: 404,
    RequestOutcome.CAPACITY.value: 429,
    RequestOutcome.UNAVAILABLE.value: 503,
}


def refused_all(stats: ModelStats) -> str | None:
    """``every request refused: 9 x 503 (unavailable)`` when the server answered every request of the phase
    with a refusal (400, 404, 429, 503) and served none; else None. Such a phase says nothing about load: the
    model was not driven past what it serves, it served nothing."""
    if stats.requests == 0 or stats.succeeded or set(stats.outcomes) - set(REFUSALS):
        return None
    parts = [
        f"{n} x {REFUSALS[name]} ({name})"
        for name, n in sorted(stats.outcomes.items(), key=lambda kv: (-kv[1], kv[0]))
        if n
    ]
    return "every request refused: " + ", ".join(parts)


def saturated(stats: ModelStats) -> bool:
    """The model was driven past what it serves: it refused requests (429/503) while serving others, or during
    the arrival period it delivered clearly fewer tokens than were offered (a queue was building up). A phase
    in which every request was refused (:func:`refused_all`) is not saturation: nothing was served."""
    if refused_all(stats) is not None:
        return False
    if (
        stats.outcomes.get(RequestOutcome.CAPACITY.value, 0) + stats.outcomes.get(RequestOutcome.UNAVAILABLE.value, 0)
        > 0
    ):
        return True
    off, got = stats.offered_tokens_per_s, stats.delivered_tokens_per_s
    return off is not None and got is not None and off > 0 and got < SATURATION_SHARE * off


__all__ = [
    "Comparison",
    "ModelStats",
    "Slo",
    "compare",
    "default_window",
    "degradation",
    "refused_all",
    "saturated",
    "summarize",
    "window_rates",
]
