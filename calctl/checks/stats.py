"""Small statistics used by every runner: percentiles, dispersion, bootstrap CIs, and the one decision rule.

Bootstrap resampling is seeded, so the same measurements always give the same
interval in a report.

**The decision rule** (:func:`decide`), applied by every timed gate (PoC
S1/S2, the bench gates, accept's G2–G5 and M1–M3, warm-up stability): a gate
is decided only when the confidence interval of its statistic lies wholly on
one side of the limit, and only from at least the samples its statistic needs
(two for any interval; ``1 / (1 - q)`` for a percentile ``q``). While the
interval straddles the limit a runner measures more rounds, up to a budget its
level sets (:func:`until_decided`); what is still undecided then is reported
**NOT JUDGED** (accept: NOT MEASURED) with the interval, the sample count and
what would decide it — never a PASS or a FAIL drawn from an interval that
reaches both sides.
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

    def tail(self) -> tuple[str, float | None]:
        """The tail figure a person may read: (``P99``, P99) from :data:`MIN_P99_SAMPLES` samples on, else
        (``max``, the largest): a "P99" of 19 samples is only its largest one, interpolated (#53 item 10)."""
        return ("P99", self.p99) if self.count >= MIN_P99_SAMPLES else ("max", self.max)


#: Samples a P99 needs before it is printed as one: with fewer, no sample lies beyond the 99th percentile.
MIN_P99_SAMPLES = 100


def tail_of(values: Sequence[float]) -> tuple[str, float | None]:
    """:meth:`Percentiles.tail` of ``values``."""
    return percentiles(values).tail()


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
    than a fake zero-width interval. A statistic that is not a number on the data (0/0: windows with nothing
    in them) was not measured: ``mean`` is None too, never a NaN that a report would print as a figure.
    """
    data = np.asarray(samples, dtype=np.float64)
    n = len(data)
    if n == 0:
        return Estimate(None, None, None, 0, confidence)
    stat = statistic or (lambda x: float(np.mean(x)))
    point = float(stat(data))
    if not math.isfinite(point):
        return Estimate(None, None, None, n, confidence)
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


@dataclass(frozen=True)
class Decision:
    """One gate judged by :func:`decide`: ``passed`` True / False, or None (not judged, ``why`` says why)."""

    passed: bool | None
    estimate: Estimate
    limit: float
    above: bool  # the passing side: the interval must lie above the limit (True) or below it (False)
    min_samples: int
    why: str  # a sentence: the interval against the limit, or why there is none

    @property
    def decided(self) -> bool:
        return self.passed is not None

    def as_dict(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "limit": self.limit,
            "passing_side": "above" if self.above else "below",
            "min_samples": self.min_samples,
            **self.estimate.as_dict(),
            "why": self.why,
        }


def decide(
    estimate: Estimate,
    limit: float,
    *,
    above: bool,
    min_samples: int = 2,
    strict: bool = False,
    what: str = "the statistic",
    fmt: str = ".3f",
) -> Decision:
    """The decision rule: pass when the CI lies on the passing side of ``limit``, fail when it lies on the other.

    ``above``: passing means greater than the limit. With ``strict`` the passing side excludes the limit itself
    (a CI "above 0" must not touch 0); otherwise a CI bound equal to the limit counts as on the passing side.
    Fewer than ``min_samples`` samples, no interval, or an interval that reaches both sides: not judged.
    """
    lo, hi = estimate.ci_low, estimate.ci_high
    ci = f"[{_f(lo, fmt)}, {_f(hi, fmt)}]"
    side = "above" if above else "below"

    def decision(verdict: bool | None, why: str) -> Decision:
        return Decision(verdict, estimate, limit, above, min_samples, f"{what}{why}")

    if estimate.n < max(2, min_samples):
        return decision(
            None, f": {estimate.n} sample(s), the rule needs at least {max(2, min_samples)} for an interval"
        )
    if lo is None or hi is None:
        return decision(None, ": no confidence interval")

    if above:
        passes = lo > limit or (not strict and lo == limit)
        fails = hi < limit or (strict and hi == limit)
    else:
        passes = hi < limit or (not strict and hi == limit)
        fails = lo > limit or (strict and lo == limit)
    if passes:
        return decision(True, f" CI {ci} lies {side} {_f(limit, fmt)} (n={estimate.n})")
    if fails:
        other = "below" if above else "above"
        at = " (or on)" if strict else ""
        return decision(False, f" CI {ci} lies {other}{at} {_f(limit, fmt)} (n={estimate.n})")
    return decision(None, f" CI {ci} straddles {_f(limit, fmt)} (n={estimate.n}): more samples would decide it")


def until_decided(
    measure: Callable[[], None],
    decided: Callable[[], bool],
    *,
    first: int,
    budget: int,
) -> int:
    """Call ``measure`` ``first`` times, then once more at a time while ``decided()`` is False, up to ``budget``
    calls in all. Returns how many were made. ``budget`` below ``first`` is ``first``."""
    done = 0
    while done < first or (done < budget and not decided()):
        measure()
        done += 1
    return done


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
