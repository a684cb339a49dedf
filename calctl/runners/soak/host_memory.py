"""The soak's verdict on the serving process's own memory: its trend over the run, not a fixed limit (issue 53).

After every unload the soak reads the process's resident set (VmRSS). A process with bounded caches (the
runtime's history of finished jobs, calctl/runtime/history.py; the allocator's arenas) grows until they are
full, then stays; a leak grows by the same amount every cycle for as long as the run lasts. So the verdict:

* **warm-up**: the cycles up to the later of cycle :data:`MIN_WARMUP_CYCLES` and the first cycle at whose
  unload the runtime said its job history was full (a runtime that does not say: the minimum alone). They
  are excluded: they are the caches filling, not a trend. While the history is still filling there is no
  trend to judge (its growth is not a leak): the fixed limit applies.
* **trend**, with at least :data:`MIN_TREND_CYCLES` cycles after the warm-up: the least-squares slope of
  VmRSS over the cycle index and its 95 % confidence interval (Student's t). FAIL when the interval's lower
  end is above :data:`SLOPE_LIMIT_BYTES` a cycle: the process keeps growing, beyond noise, by more than that.
  A healthy run's slope is near 0; a step (an arena grown once) moves it by step / cycles, not per cycle.
* **fixed limit**, when the run is too short for a trend: VmRSS after each unload against the first cycle's,
  within ``max(64 MiB, 10 %)`` (what the soak judged before; a short run cannot tell a cache from a leak).

The report says which of the two it used, the warm-up it excluded and why, and the slope with its interval.
Pure functions over the samples: nothing here reads /proc or a device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIB = 1024**2
KIB = 1024
#: Cycles never judged for a trend: the first load builds and maps what every later one reuses.
MIN_WARMUP_CYCLES = 3
#: Cycles after the warm-up a trend needs; fewer: the fixed limit.
MIN_TREND_CYCLES = 20
#: A slope (bytes a cycle) whose 95 % interval lies wholly above this FAILs: 64 KiB a cycle is 6.4 MiB over 100
#: cycles, 64 MiB over 1,000; a leak of a few hundred KiB a cycle is well above it.
SLOPE_LIMIT_BYTES = 64 * KIB
#: The fixed limit of a short run (and of the soak before issue 53): growth over the first cycle's VmRSS.
FIXED_FLOOR_BYTES = 64 * MIB
FIXED_FRACTION = 0.10

# Two-sided 95 % quantiles of Student's t by degrees of freedom (the largest tabled <= df is used).
_T95 = ((1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (18, 2.101), (30, 2.042), (60, 2.000), (120, 1.980))


def fixed_limit_bytes(reference_bytes: int) -> int:
    return max(FIXED_FLOOR_BYTES, int(reference_bytes * FIXED_FRACTION))


def t95(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with ``df`` degrees of freedom (conservative between rows)."""
    if df > 120:
        return 1.960
    return next(t for d, t in reversed(_T95) if d <= max(df, 1))


@dataclass(frozen=True)
class Trend:
    """A least-squares line of VmRSS over the cycle index: bytes a cycle, its 95 % interval, the cycles fitted."""

    slope: float
    low: float
    high: float
    first_cycle: int
    last_cycle: int
    n: int

    def document(self) -> dict[str, Any]:
        return {
            "slope_bytes_per_cycle": round(self.slope, 1),
            "interval_95_bytes_per_cycle": [round(self.low, 1), round(self.high, 1)],
            "cycles": [self.first_cycle, self.last_cycle],
            "samples": self.n,
        }

    def words(self) -> str:
        return (
            f"{self.slope / KIB:+.1f} KiB a cycle (95 % interval {self.low / KIB:+.1f} .. {self.high / KIB:+.1f}) "
            f"over cycles {self.first_cycle}..{self.last_cycle}"
        )


def fit(samples: Sequence[tuple[int, int]]) -> Trend:
    """Least squares of ``(cycle, bytes)``; needs at least 3 samples with two different cycles."""
    n = len(samples)
    xs = [float(c) for c, _ in samples]
    ys = [float(b) for _, b in samples]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 3 or sxx == 0:
        raise ValueError(f"a trend needs 3 or more samples over 2 or more cycles, got {n}")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    sse = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    half = t95(n - 2) * math.sqrt(sse / (n - 2) / sxx)
    return Trend(slope, slope - half, slope + half, int(xs[0]), int(xs[-1]), n)


@dataclass(frozen=True)
class HostMemoryVerdict:
    """What the soak saw of the process's memory: the method, the warm-up, the trend or the fixed limit."""

    method: str  # "trend" | "fixed limit" | "not measured"
    warmup_cycles: int  # cycles 1..warmup_cycles excluded from the trend
    warmup_reason: str
    trend: Trend | None
    reference_bytes: int | None
    limit_bytes: int | None  # fixed limit, or None with a trend
    over_limit: tuple[tuple[int, int], ...]  # fixed limit: (cycle, growth bytes) of each unload over it
    ok: bool

    def words(self) -> str:
        if self.method == "trend":
            assert self.trend is not None
            return (
                f"trend {self.trend.words()} after a warm-up of {self.warmup_cycles} cycle(s) ({self.warmup_reason}); "
                f"limit {SLOPE_LIMIT_BYTES / KIB:.0f} KiB a cycle"
            )
        if self.method == "fixed limit":
            return (
                f"fixed limit: {self.limit_bytes / MIB if self.limit_bytes else 0:.1f} MiB over the first cycle's "
                f"VmRSS (a trend needs {MIN_TREND_CYCLES} cycles after the warm-up of {self.warmup_cycles}: "
                f"{self.warmup_reason})"
            )
        return "not measured (no VmRSS on this host)"

    def document(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "warmup_cycles": self.warmup_cycles,
            "warmup_reason": self.warmup_reason,
            "trend": self.trend.document() if self.trend else None,
            "slope_limit_bytes_per_cycle": SLOPE_LIMIT_BYTES,
            "fixed_limit_bytes": self.limit_bytes,
            "ok": self.ok,
            "summary": self.words(),
        }


def warmup(caches_full_at: int | None, cycles: int, *, reported: bool = True) -> tuple[int, str]:
    """The cycles excluded from the trend and why (see the module docstring). A history that is reported but
    never filled: every cycle is warm-up."""
    if caches_full_at is None and reported:
        return cycles, f"the runtime's job history was still filling after {cycles} cycle(s)"
    if caches_full_at is None:
        return MIN_WARMUP_CYCLES, f"the first {MIN_WARMUP_CYCLES}; the runtime does not report its job history"
    if caches_full_at <= MIN_WARMUP_CYCLES:
        return MIN_WARMUP_CYCLES, f"the first {MIN_WARMUP_CYCLES}; the job history was full at cycle {caches_full_at}"
    return caches_full_at, f"until the runtime's job history filled, at cycle {caches_full_at}"


def judge(
    samples: Sequence[tuple[int, int | None]], caches_full_at: int | None, *, reported: bool = True
) -> HostMemoryVerdict:
    """The verdict over ``(cycle, VmRSS after its unload)`` samples (None: not measured that cycle).
    ``caches_full_at``: the first cycle the runtime's job history was full; ``reported``: whether the runtime
    says how full it is at all."""
    known = [(c, r) for c, r in samples if r is not None]
    if not known:
        return HostMemoryVerdict("not measured", 0, "", None, None, None, (), True)
    cycles = known[-1][0]
    skip, why = warmup(caches_full_at, cycles, reported=reported)
    judged = [(c, r) for c, r in known if c > skip]
    reference = known[0][1]
    if len(judged) >= MIN_TREND_CYCLES:
        trend = fit(judged)
        return HostMemoryVerdict("trend", skip, why, trend, reference, None, (), trend.low <= SLOPE_LIMIT_BYTES)
    limit = fixed_limit_bytes(reference)
    over = tuple((c, r - reference) for c, r in known if r - reference > limit)
    return HostMemoryVerdict("fixed limit", skip, why, None, reference, limit, over, not over)


__all__ = [
    "MIN_TREND_CYCLES",
    "MIN_WARMUP_CYCLES",
    "SLOPE_LIMIT_BYTES",
    "HostMemoryVerdict",
    "Trend",
    "fit",
    "fixed_limit_bytes",
    "judge",
    "t95",
    "warmup",
]
