"""The GO/NO-GO rule of 001 §8.2 for one chip.

001 §8.1 lists ``safety_guard`` as a term of ``M_required``; 001 §8.2 states the
same thing as two conditions on the static budget. calctl counts the guard once:

* ``static`` is the sum of every §8.1 term except the guard;
* ``limit_bytes = floor(limit × DRAM)`` (limit 0.75–0.80 recommended);
* ``guard_bytes = max(guard_min, ceil(guard_fraction × DRAM))`` (at least
  ``max(1 GiB, 15 % local DRAM)`` for runtime, fragmentation, transient
  workspace and recovery);
* GO iff ``static <= limit_bytes`` **and** ``DRAM - static >= guard_bytes``,
  i.e. ``static <= usable_bytes = min(limit_bytes, DRAM - guard_bytes)``;
* ``required_bytes = static + guard_bytes`` is §8.1's ``M_required``; the second
  condition is the same as ``required_bytes <= DRAM``.

Fractions are exact (``Fraction(str(0.8))`` is 4/5), so the verdict flips exactly
one byte past the threshold. ``DRAM`` is always one chip's local DRAM, never the
board total (001 §8.2, last bullet). This module only judges numbers; it does
not compute them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction

from calctl.budget.units import GIB, MAX_SIZE_BYTES, fraction, gib, human
from calctl.errors import UsageError

#: 001 §8.2: "静态 M_required 不超过厂商确认的本地 DRAM 的 75%-80%".
RECOMMENDED_LIMITS = (0.75, 0.80)


class BudgetVerdict(str, enum.Enum):
    GO = "GO"
    NO_GO = "NO-GO"


@dataclass(frozen=True)
class BudgetJudgement:
    """What :meth:`BudgetPolicy.judge` decides: the verdict and the sentences that explain it."""

    verdict: BudgetVerdict
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class BudgetPolicy:
    """Limit and guard of 001 §8.2; defaults are the report's numbers."""

    limit: float = 0.80
    guard_fraction: float = 0.15
    guard_min_bytes: int = GIB

    def __post_init__(self) -> None:
        check_fraction(self.limit, "limit", zero_ok=False, one_ok=True)
        check_fraction(self.guard_fraction, "guard_fraction", zero_ok=True, one_ok=False)
        if not 0 <= self.guard_min_bytes <= MAX_SIZE_BYTES:
            raise UsageError(f"guard_min_bytes {self.guard_min_bytes} is out of range")

    @property
    def within_recommendation(self) -> bool:
        lo, hi = RECOMMENDED_LIMITS
        return lo <= self.limit <= hi

    def limit_bytes(self, dram_bytes: int) -> int:
        return int(Fraction(str(self.limit)) * dram_bytes)  # floor: never round a ceiling up

    def guard_bytes(self, dram_bytes: int) -> int:
        fraction = Fraction(str(self.guard_fraction)) * dram_bytes
        return max(self.guard_min_bytes, -(-fraction.numerator // fraction.denominator))  # ceil

    def usable_bytes(self, dram_bytes: int) -> int:
        """The largest static budget that is still GO."""
        return max(0, min(self.limit_bytes(dram_bytes), dram_bytes - self.guard_bytes(dram_bytes)))

    def passes(self, static_bytes: int, dram_bytes: int) -> bool:
        return static_bytes <= self.usable_bytes(dram_bytes)

    def judge(self, static_bytes: int, dram_bytes: int) -> BudgetJudgement:
        """BudgetVerdict and the sentences that explain it (failed checks first)."""
        limit = self.limit_bytes(dram_bytes)
        guard = self.guard_bytes(dram_bytes)
        reserve = dram_bytes - static_bytes
        limit_ok = static_bytes <= limit
        guard_ok = reserve >= guard
        limit_text = (
            f"static {gib(static_bytes)} GiB {'<=' if limit_ok else '>'} limit {gib(limit)} GiB "
            f"({fraction(self.limit)} of {gib(dram_bytes)} GiB chip DRAM, 001 §8.2)"
        )
        guard_text = (
            f"reserve {gib(reserve)} GiB {'>=' if guard_ok else '<'} guard {gib(guard)} GiB "
            f"(max({human(self.guard_min_bytes)}, {fraction(self.guard_fraction)} of chip DRAM), 001 §8.2)"
        )
        checks = [(limit_ok, limit_text), (guard_ok, guard_text)]
        failed = tuple(t for ok, t in checks if not ok)
        if failed:
            return BudgetJudgement(BudgetVerdict.NO_GO, failed)
        return BudgetJudgement(BudgetVerdict.GO, tuple(t for _, t in checks))


def check_fraction(value: float, what: str, *, zero_ok: bool, one_ok: bool) -> float:
    """Raise :class:`UsageError` naming ``what`` unless ``value`` is a fraction in range."""
    lo_ok = value >= 0 if zero_ok else value > 0
    hi_ok = value <= 1 if one_ok else value < 1
    if not (lo_ok and hi_ok):  # NaN fails both comparisons too
        lo = "[0" if zero_ok else "(0"
        hi = "1]" if one_ok else "1)"
        raise UsageError(f"{what} {value!r} is outside {lo}, {hi}", hint="a fraction of chip DRAM, e.g. 0.80")
    return value
