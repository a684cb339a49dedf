"""Dual-chip concurrency evidence: overlap ratio, throughput efficiency, S1/S2 (001 §1, §13.2).

Definitions from 001 §13.2:

* ``T_serial = T(A isolated) + T(B isolated)``, ``T_joint`` = wall time of A and B together;
  ``overlap_ratio = 1 - T_joint / T_serial``;
* ``throughput_efficiency = joint tokens/s / (A isolated tokens/s + B isolated tokens/s)``.

S2 (hardware concurrency) is declared only when all three hold (001 §1: only
the per-chip trace, the timeline and the joint throughput together prove S2):

* the per-chip trace shows chip0 and chip1 computing at the same time for at
  least :data:`TRACE_OVERLAP_GATE` of the joint wall time (001 §13.2 "per-chip
  trace 显示 A/B compute 区间真实重叠"); no trace means no S2;
* the bootstrap CI of ``overlap_ratio`` lies above 0;
* the efficiency is at least 0.80.

Anything else is S1 (service coexistence), and every reason names the evidence
it rests on: wall-clock figures alone never make S2.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from calctl.checks.stats import Estimate, bootstrap

EFFICIENCY_GATE = 0.80
#: Least share of the joint wall time with both chips computing (per-chip trace) for S2. A few percent of
#: overlap is what two serialised chips show from clock skew and the gap between one job's end and the next's
#: start; a real dual-chip run keeps both chips busy for most of the joint window.
TRACE_OVERLAP_GATE = 0.25


@dataclass(frozen=True)
class Round:
    """One measurement round: A alone, B alone, then A+B together."""

    t_a: float
    t_b: float
    t_joint: float
    tokens_a: int
    tokens_b: int
    tokens_joint: int

    @property
    def overlap_ratio(self) -> float:
        return 1.0 - self.t_joint / (self.t_a + self.t_b)

    @property
    def efficiency(self) -> float:
        iso = self.tokens_a / self.t_a + self.tokens_b / self.t_b
        return (self.tokens_joint / self.t_joint) / iso


@dataclass(frozen=True)
class Interval:
    chip: int
    start: float
    end: float


def both_busy_fraction(intervals: Iterable[Interval], window: tuple[float, float]) -> float | None:
    """Fraction of ``window`` during which chip0 and chip1 both had a job running."""
    lo, hi = window
    if hi <= lo:
        return None
    per_chip: dict[int, list[tuple[float, float]]] = {}
    for iv in intervals:
        s, e = max(iv.start, lo), min(iv.end, hi)
        if e > s:
            per_chip.setdefault(iv.chip, []).append((s, e))
    if len(per_chip) < 2:
        return 0.0
    chips = sorted(per_chip)[:2]
    a, b = (_union(per_chip[c]) for c in chips)
    both = 0.0
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            both += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return both / (hi - lo)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


@dataclass(frozen=True)
class ConcurrencyVerdict:
    verdict: str  # "S1" | "S2"
    overlap_ratio: Estimate
    throughput_efficiency: Estimate
    both_busy_fraction: float | None
    reasons: tuple[str, ...] = field(default_factory=tuple)


def trace_reason(both_busy: float | None, gate: float = TRACE_OVERLAP_GATE) -> tuple[bool, str]:
    """Whether the per-chip trace shows the chips computing together, and the sentence that says so."""
    if both_busy is None:
        return False, "no per-chip trace of the joint window: the chips' overlap is unknown, S2 cannot be shown"
    if both_busy < gate:
        return False, (
            f"per-chip trace: both chips computing during only {both_busy:.0%} of the joint wall time "
            f"(below the {gate:.0%} gate): the chips took turns"
        )
    return True, f"per-chip trace: both chips computing during {both_busy:.0%} of the joint wall time (>= {gate:.0%})"


def judge(
    rounds: Sequence[Round],
    *,
    both_busy: float | None = None,
    efficiency_gate: float = EFFICIENCY_GATE,
    trace_gate: float = TRACE_OVERLAP_GATE,
    seed: int = 0,
) -> ConcurrencyVerdict:
    """S1 or S2 from the rounds' wall clock and the per-chip trace (``both_busy``: share of the joint window)."""
    overlap = bootstrap([r.overlap_ratio for r in rounds], seed=seed)
    eff = bootstrap([r.efficiency for r in rounds], seed=seed + 1)
    reasons: list[str] = []
    trace_ok, trace_says = trace_reason(both_busy, trace_gate)
    if not trace_ok:
        reasons.append(trace_says)
    if len(rounds) < 2:
        reasons.append(f"only {len(rounds)} round(s): no confidence interval, S2 cannot be shown")
    elif overlap.ci_low is None or overlap.ci_low <= 0:
        reasons.append(
            f"overlap_ratio CI [{_fmt(overlap.ci_low)}, {_fmt(overlap.ci_high)}] does not lie above 0: "
            "chip0 and chip1 did not run at the same time (a global lock or shared queue serialises them)"
        )
    if eff.mean is None or eff.mean < efficiency_gate:
        reasons.append(f"throughput_efficiency {_fmt(eff.mean)} is below the {efficiency_gate:.2f} gate (001 §13.2)")
    verdict = "S1" if reasons else "S2"
    if verdict == "S2":
        reasons.append(
            f"{trace_says}; overlap_ratio CI [{_fmt(overlap.ci_low)}, {_fmt(overlap.ci_high)}] above 0 and "
            f"efficiency {_fmt(eff.mean)} >= {efficiency_gate:.2f}"
        )
    return ConcurrencyVerdict(verdict, overlap, eff, both_busy, tuple(reasons))


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"
