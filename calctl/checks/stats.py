"""Small statistics used by every runner: percentiles, dispersion, bootstrap CIs.

Bootstrap resampling is seeded, so the same measurements always give the same
interval in a report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Percentiles:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    min: float | None
    max: float | None
    cv: float | None  # coefficient of variation (std / mean)


def percentiles(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles(0, None, None, None, None, None, None, None)
    a = np.asarray(values, dtype=np.float64)
    mean = float(a.mean())
    cv = float(a.std(ddof=1) / mean) if len(a) > 1 and mean > 0 else None
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    return Percentiles(len(a), mean, p50, p90, p99, float(a.min()), float(a.max()), cv)


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a bootstrap confidence interval."""

    mean: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    confidence: float = 0.95

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "mean": self.mean,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "n": self.n,
            "confidence": self.confidence,
        }


def bootstrap(
    samples: Sequence[float] | Sequence[Sequence[float]],
    statistic: Callable[[np.ndarray], float] | None = None,
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Percentile bootstrap of ``statistic`` over rows of ``samples`` (rows are rounds).

    With one row there is no interval: ``ci_low``/``ci_high`` are None rather
    than a fake zero-width interval.
    """
    data = np.asarray(samples, dtype=np.float64)
    n = len(data)
    if n == 0:
        return Estimate(None, None, None, 0, confidence)
    stat = statistic or (lambda x: float(np.mean(x)))
    point = float(stat(data))
    if n < 2:
        return Estimate(point, None, None, n, confidence)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    values = np.array([stat(data[i]) for i in idx])
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return Estimate(point, None, None, n, confidence)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return Estimate(point, float(lo), float(hi), n, confidence)


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
