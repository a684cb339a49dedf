"""Dual-chip concurrency evidence: overlap ratio, throughput efficiency, S1/S2 (001 §1, §13.2).

Definitions from 001 §13.2:

* ``T_serial = T(A isolated) + T(B isolated)``, ``T_joint`` = time of A and B together;
  ``overlap_ratio = 1 - T_joint / T_serial``;
* ``throughput_efficiency = joint tokens/s / (A isolated tokens/s + B isolated tokens/s)``.

**On the device's clock.** The times are the device's, from the runtime's own
job start/end stamps (:func:`device_seconds`): a chip's time in a phase is the
sum over its jobs of ``end - max(submit, the chip's previous end)``, its
compute plus any wait the device imposed on work already submitted (a global
lock or a shared queue shows up there). ``T_joint`` is the longer of the two
chips' times. What the host adds between one job's end and the next submit
(the Python loop, a thread the scheduler starved) is not the chips' time: it
is reported beside the figures as host overhead (:func:`host_overhead`) and
never enters a verdict. The per-chip trace share (:func:`joint_share`) is the
part of the less busy chip's compute that ran while the other chip was
computing too.

S2 (hardware concurrency) needs all three, each decided by the one rule of
:func:`calctl.checks.stats.decide` (the bootstrap CI over rounds lies on the
passing side of its limit):

* trace share CI above :data:`TRACE_OVERLAP_GATE` (001 §13.2 "per-chip trace
  显示 A/B compute 区间真实重叠"; 001 §1: wall clock alone never proves S2);
* overlap_ratio CI above 0;
* throughput_efficiency CI above 0.80.

S1 when any of them is decided on the failing side (each reason names its
evidence); **NOT JUDGED** when none failed but one still straddles its limit
after the rounds the budget allows, or the runtime reports no job timestamps
(then the device's time is unknown and S2 cannot be shown).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from calctl.checks.stats import Decision, Estimate, bootstrap, decide
from calctl.runtime.intervals import overlap as joint_time
from calctl.runtime.intervals import union

EFFICIENCY_GATE = 0.80
#: Least share of the joint wall time with both chips computing (per-chip trace) for S2. A few percent of
#: overlap is what two serialised chips show from clock skew and the gap between one job's end and the next's
#: start; a real dual-chip run keeps both chips busy for most of the joint window.
TRACE_OVERLAP_GATE = 0.25
NOT_JUDGED = "NOT JUDGED"


@dataclass(frozen=True)
class OverlapRound:
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


@dataclass(frozen=True)
class JobSpan:
    """One job on the device's clock (seconds): submitted, started and ended on ``chip``."""

    chip: int
    submit: float
    start: float
    end: float


def device_seconds(jobs: Iterable[JobSpan]) -> dict[int, float]:
    """Per chip: the sum over its jobs of ``end - max(submit, previous end on the chip)``.

    That is the chip's compute plus every wait the device imposed on work already submitted to it; the gaps
    where nothing was submitted (host time) are left out.
    """
    out: dict[int, float] = {}
    by_chip: dict[int, list[JobSpan]] = {}
    for j in jobs:
        by_chip.setdefault(j.chip, []).append(j)
    for chip, spans in by_chip.items():
        prev = -np.inf
        total = 0.0
        for j in sorted(spans, key=lambda x: (x.start, x.end)):
            begin = max(j.submit, prev)
            total += max(0.0, j.end - begin)
            prev = max(prev, j.end)
        out[chip] = total
    return out


def joint_share(jobs: Iterable[JobSpan]) -> float | None:
    """Share of the less busy chip's compute during which the other chip computed too (None: not two chips)."""
    per_chip: dict[int, list[tuple[float, float]]] = {}
    for j in jobs:
        if j.end > j.start:
            per_chip.setdefault(j.chip, []).append((j.start, j.end))
    if len(per_chip) < 2:
        return None
    a, b = (union(per_chip[c]) for c in sorted(per_chip)[:2])
    busy = min(sum(e - s for s, e in a), sum(e - s for s, e in b))
    if busy <= 0:
        return None
    return joint_time(a, b) / busy


def host_overhead(host_s: float, device_s: float) -> float:
    """Seconds the host added to a phase beyond the device's time (never negative)."""
    return max(0.0, host_s - device_s)


def joint_share_in(intervals: Iterable[Interval], window: tuple[float, float]) -> float | None:
    """Share of the less busy chip's busy time inside ``window`` during which the other chip was busy too.

    The device-clock S2 figure of :func:`joint_share`, for trace intervals clipped to a phase's window. It
    does not fall when the host feeds the chips slowly (both chips idle more, the share of the busy time
    they overlap stays); a global lock makes it 0 whatever the load. None: fewer than two chips busy."""
    lo, hi = window
    per_chip: dict[int, list[tuple[float, float]]] = {}
    for iv in intervals:
        s, e = max(iv.start, lo), min(iv.end, hi)
        if e > s:
            per_chip.setdefault(iv.chip, []).append((s, e))
    if len(per_chip) < 2:
        return 0.0 if per_chip else None
    a, b = (union(per_chip[c]) for c in sorted(per_chip)[:2])
    busy = min(sum(e - s for s, e in a), sum(e - s for s, e in b))
    return joint_time(a, b) / busy if busy > 0 else None


@dataclass(frozen=True)
class ConcurrencyVerdict:
    verdict: str  # "S1" | "S2" | "NOT JUDGED"
    overlap_ratio: Estimate
    throughput_efficiency: Estimate
    both_busy_fraction: float | None  # mean per-chip trace share over the rounds
    reasons: tuple[str, ...] = field(default_factory=tuple)
    decisions: dict[str, Decision] = field(default_factory=dict)
    trace_share: Estimate | None = None

    @property
    def decided(self) -> bool:
        return self.verdict != NOT_JUDGED


def trace_reason(both_busy: float | None, gate: float = TRACE_OVERLAP_GATE) -> tuple[bool, str]:
    """Whether a single trace share shows the chips computing together, and the sentence that says so."""
    if both_busy is None:
        return False, "no per-chip trace of the joint window: the chips' overlap is unknown, S2 cannot be shown"
    if both_busy < gate:
        return False, (
            f"per-chip trace: both chips computing during only {both_busy:.0%} of the joint time "
            f"(below the {gate:.0%} gate): the chips took turns"
        )
    return True, f"per-chip trace: both chips computing during {both_busy:.0%} of the joint time (>= {gate:.0%})"


def judge(
    rounds: Sequence[OverlapRound],
    *,
    shares: Sequence[float | None] = (),
    efficiency_gate: float = EFFICIENCY_GATE,
    trace_gate: float = TRACE_OVERLAP_GATE,
    seed: int = 0,
) -> ConcurrencyVerdict:
    """S1, S2 or NOT JUDGED from the rounds (device-clock times) and each round's per-chip trace share."""
    overlap = bootstrap([r.overlap_ratio for r in rounds], seed=seed)
    eff = bootstrap([r.efficiency for r in rounds], seed=seed + 1)
    known = [x for x in shares if x is not None]
    share = bootstrap(known, seed=seed + 2) if known and len(known) == len(rounds) else None
    mean_share = float(np.mean(known)) if known else None
    decisions = {
        "overlap_ratio": decide(overlap, 0.0, above=True, strict=True, what="overlap_ratio"),
        "throughput_efficiency": decide(eff, efficiency_gate, above=True, what="throughput_efficiency"),
    }
    failed: list[str] = []
    open_: list[str] = []
    if share is None:
        open_.append(
            "no per-chip job timestamps for every joint round (the runtime reports none): the device's time is "
            "unknown and S2 cannot be shown"
        )
    else:
        decisions["per_chip_trace"] = d = decide(share, trace_gate, above=True, what="per-chip trace share")
        if d.passed is False:
            failed.append(
                f"per-chip trace: both chips computing during {mean_share:.0%} of the less busy chip's time, "
                f"{d.why} (the {trace_gate:.0%} gate): the chips took turns"
            )
        elif d.passed is None:
            open_.append(f"per-chip trace: {d.why}")
    d = decisions["overlap_ratio"]
    if d.passed is False:
        failed.append(
            f"{d.why}: chip0 and chip1 did not run at the same time (a global lock or shared queue serialises them)"
        )
    elif d.passed is None:
        open_.append(d.why)
    d = decisions["throughput_efficiency"]
    if d.passed is False:
        failed.append(f"{d.why} (the {efficiency_gate:.2f} gate, 001 §13.2)")
    elif d.passed is None:
        open_.append(f"{d.why} (the {efficiency_gate:.2f} gate)")
    if failed:
        verdict, reasons = "S1", failed
    elif open_:
        verdict, reasons = NOT_JUDGED, open_
    else:
        verdict = "S2"
        reasons = [
            f"{decisions['per_chip_trace'].why}; {decisions['overlap_ratio'].why}; "
            f"{decisions['throughput_efficiency'].why}"
        ]
    return ConcurrencyVerdict(verdict, overlap, eff, mean_share, tuple(reasons), decisions, share)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"
