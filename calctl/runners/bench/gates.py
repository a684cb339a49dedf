"""The 001 §13.2 gates, each a small value with its rule, its measured value and a verdict.

=========================  ==================================================  ===========
gate                       rule                                                 001 §13.2
=========================  ==================================================  ===========
per_chip_trace_overlap     both busy >= 25 % of the less busy chip's busy time "per-chip trace 显示 A/B compute 区间真实重叠"
overlap_ratio              bootstrap CI lies above 0                            "置信区间不跨 0"
throughput_efficiency      bootstrap CI lies above 0.80 (steady state)          "稳态 >= 0.80"
p99_ttft_degradation[X]    P99 TTFT of X joint <= 1.25 x isolated               "退化不超过 25%"
p99_tpot_degradation[X]    P99 TPOT of X joint <= 1.25 x isolated               "退化不超过 25%"
b_success_rate             B's success rate in the joint phase >= 99.9 %        "A 满载时 B 成功率 >= 99.9%"
=========================  ==================================================  ===========

Every gate with an interval follows the one decision rule
(:func:`calctl.checks.stats.decide`): PASS when its confidence interval lies
on the passing side of the limit, FAIL when it lies on the other side, NOT
JUDGED while it straddles the limit (the note gives the interval, the sample
count and what would decide it).

A gate that cannot be judged is ``passed=None``, verdict **NOT JUDGED**, with
the reason: never a made-up pass or fail. That includes a percentile read from
too few samples: percentile ``q`` is judged only from at least ``1 / (1 - q)``
samples (:data:`MIN_SAMPLES`: P50 2, P90 10, P99 100), so that at least one
sample lies beyond it; from 17 requests the "P99" is the slowest one, and a
gate on it would judge one request. B's success rate is PASS only from at
least :data:`B_SUCCESS_MIN_REQUESTS` requests (what 99.9 % can be told from);
an observed rate below the gate is FAIL at any count (the failed requests are
facts, not a tail estimate). A NOT JUDGED gate names the sample count and the
``--duration`` or ``--rate`` that would give enough.

The per-chip trace gate is what makes a PASS evidence of S2 (001 §1: only the
per-chip trace, the timeline and the joint throughput together prove S2):
wall-clock overlap and efficiency alone never pass the concurrency gates. The
bench reads the trace from the server's ``GET /internal/trace`` (admin key);
when it cannot, the gate is NOT JUDGED with the reason.

The verdict is FAIL when any gate failed, else NOT JUDGED when any gate could
not be judged, else PASS (MEASURED when there is no gate). This module does
not measure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calctl.checks.stats import decide
from calctl.loadgen.metrics import Comparison, ModelStats, degradation, refused_all, saturated
from calctl.runners.overlap import TRACE_OVERLAP_GATE

EFFICIENCY_GATE = 0.80
P99_DEGRADATION_GATE = 0.25
B_SUCCESS_GATE = 0.999

#: Fewest samples a percentile is judged from: 1 / (1 - q), so at least one sample lies beyond it.
MIN_SAMPLES = {"p50": 2, "p90": 10, "p99": 100}
#: Fewest requests a B success rate of 99.9 % can be PASSED from (one failure is 0.1 %).
B_SUCCESS_MIN_REQUESTS = 1000

NOT_JUDGED = "NOT JUDGED"


@dataclass(frozen=True)
class Load:
    """The open-loop load of a phase (per model), to say what would give enough samples."""

    duration_s: float
    rate: float

    def advice(self, have: int, need: int) -> str:
        if have <= 0:
            return "no sample at all: check that the requests succeed"
        factor = need / have
        return (
            f"--duration {math.ceil(self.duration_s * factor):g} (at --rate {self.rate:g}) or "
            f"--rate {self.rate * factor:.3g} (at --duration {self.duration_s:g}, if the server keeps up) "
            f"would give about {need}"
        )


@dataclass(frozen=True)
class Gate:
    name: str
    rule: str
    value: float | None
    passed: bool | None  # None: not judged (``note`` says why)
    detail: str = ""  # what was measured
    samples: int | None = None  # the fewest samples the judgement rests on (per phase), where that applies
    min_samples: int | None = None
    note: str = ""  # why it was not judged, and what would give enough

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: NOT_JUDGED}[self.passed]

    @property
    def full(self) -> str:
        return f"{self.detail}: {self.note}" if self.note else self.detail

    def document(self) -> dict[str, Any]:
        fields = ("name", "rule", "value", "passed", "verdict", "samples", "min_samples")
        return {**{k: getattr(self, k) for k in fields}, "detail": self.full}


HOST_CLOCK_GATES = ("throughput_efficiency", "overlap_ratio", "p99_ttft_degradation", "p99_tpot_degradation")


def host_bound(gates: Sequence[Gate], note: str) -> list[Gate]:
    """On a saturated host the gates read off the host's clock are NOT JUDGED with ``note``; the per-chip
    trace (device clock) and B's success rate still decide (calctl.checks.host)."""
    out = []
    for g in gates:
        if g.passed is not None and g.name.split(": ")[-1].split("[")[0] in HOST_CLOCK_GATES:
            g = dataclasses.replace(g, passed=None, note=note)
        out.append(g)
    return out


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x * 100:+.1f} %" if pct else f"{x:.3f}"


@dataclass(frozen=True)
class TraceEvidence:
    """The per-chip trace of the joint phase: the share with both chips computing, or why it is unknown."""

    both_busy: float | None
    device: str | None = None  # which runtime measured it (mock results are mock)
    jobs: int = 0
    missing: str = ""  # why there is no fraction


def trace_gate(trace: TraceEvidence | None) -> Gate:
    rule = f">= {TRACE_OVERLAP_GATE:.0%} of the less busy chip's busy time"
    if trace is None or trace.both_busy is None:
        why = trace.missing if trace is not None and trace.missing else "no per-chip trace was read"
        return Gate("per_chip_trace_overlap", rule, None, None, f"{why}: S2 cannot be shown from wall clock alone")
    ok = trace.both_busy >= TRACE_OVERLAP_GATE
    return Gate(
        "per_chip_trace_overlap",
        rule,
        trace.both_busy,
        ok,
        f"per-chip trace ({trace.device or 'unknown'} device, {trace.jobs} jobs): both chips computing during "
        f"{trace.both_busy:.0%} of the less busy chip's busy time in the joint phase"
        + ("" if ok else ": the chips took turns"),
    )


def concurrency_gates(cmp: Comparison, trace: TraceEvidence | None = None) -> list[Gate]:
    e, o = cmp.throughput_efficiency, cmp.overlap_ratio
    gates = [trace_gate(trace)]
    if e.mean is None:
        gates.append(
            Gate(
                "throughput_efficiency",
                f">= {EFFICIENCY_GATE:.2f}",
                None,
                None,
                "no steady-state window with isolated tokens in it: not measured",
            )
        )
    else:
        ci = f" [95 % CI {_fmt(e.ci_low)}, {_fmt(e.ci_high)}]" if e.ci_low is not None else " (no CI)"
        d = decide(e, EFFICIENCY_GATE, above=True, what="throughput_efficiency")
        gates.append(
            Gate(
                "throughput_efficiency",
                f"CI above {EFFICIENCY_GATE:.2f}",
                e.mean,
                d.passed,
                f"joint tokens/s over the sum of isolated tokens/s = {e.mean:.3f}{ci}",
                samples=e.n,
                note="" if d.passed is not None else f"{d.why}: a longer --duration gives more windows",
            )
        )
    if o.ci_low is None:
        gates.append(
            Gate(
                "overlap_ratio",
                "CI above 0",
                o.mean,
                None,
                f"overlap_ratio {_fmt(o.mean)}: fewer than 2 windows, no interval",
            )
        )
    else:
        d = decide(o, 0.0, above=True, strict=True, what="overlap_ratio")
        gates.append(
            Gate(
                "overlap_ratio",
                "CI above 0",
                o.mean,
                d.passed,
                f"overlap_ratio {_fmt(o.mean)} [95 % CI {_fmt(o.ci_low)}, {_fmt(o.ci_high)}]"
                + (
                    ": the joint run was not faster than running A and B one after the other"
                    if d.passed is False
                    else ""
                ),
                samples=o.n,
                note="" if d.passed is not None else f"{d.why}: a longer --duration gives more windows",
            )
        )
    return gates


def degradation_gates(iso: ModelStats, joint: ModelStats, load: Load | None = None) -> list[Gate]:
    out = []
    need = MIN_SAMPLES["p99"]
    for metric, pi, pj in (("ttft", iso.ttft, joint.ttft), ("tpot", iso.tpot, joint.tpot)):
        i, j = pi.p99, pj.p99
        d = degradation(i, j)
        name = f"p99_{metric}_degradation[{iso.alias}]"
        rule = f"<= {P99_DEGRADATION_GATE:.0%}"
        have = min(pi.count, pj.count)
        counts = f"n={pi.count} isolated, n={pj.count} joint"
        if d is None or i is None or j is None:
            out.append(
                Gate(name, rule, None, None, f"no P99 {metric.upper()} in isolation or jointly ({counts})", have, need)
            )
            continue
        measured = (
            f"{iso.alias} P99 {metric.upper()} {j * 1e3:.1f} ms joint vs {i * 1e3:.1f} ms isolated "
            f"({_fmt(d, True)}; {counts})"
        )
        if have < need:
            hint = f"; {load.advice(have, need)}" if load is not None else ""
            out.append(
                Gate(
                    name,
                    rule,
                    d,
                    None,
                    measured,
                    have,
                    need,
                    f"a P99 needs >= {need} samples per phase, not judged from {have}{hint}",
                )
            )
            continue
        out.append(Gate(name, rule, d, d <= P99_DEGRADATION_GATE, measured, have, need))
    return out


def b_success_gate(a_joint: ModelStats, b_joint: ModelStats, load: Load | None = None) -> Gate:
    rate = b_joint.success_rate
    a_refused = refused_all(a_joint)
    if a_refused is not None:  # not saturation: A served nothing, so B was not tested beside a loaded A
        a_note = f"A ({a_joint.alias}) was not loaded, the server refused it: {a_refused}"
    elif saturated(a_joint):
        a_note = f"A ({a_joint.alias}) was saturated ({_load_note(a_joint)})"
    else:
        a_note = (
            f"A ({a_joint.alias}) was not saturated ({_load_note(a_joint)}): raise --rate to test B under a saturated A"
        )
    if rate is None:
        return Gate(
            "b_success_rate", f">= {B_SUCCESS_GATE:.1%}", None, None, f"B ({b_joint.alias}) sent no request; {a_note}"
        )
    b_refused = refused_all(b_joint)
    b_note = f": {b_refused}" if b_refused is not None else ""
    measured = (
        f"B ({b_joint.alias}) {b_joint.succeeded}/{b_joint.requests} succeeded in the joint phase ({rate:.2%})"
        f"{b_note}; {a_note}"
    )
    need = B_SUCCESS_MIN_REQUESTS
    if rate >= B_SUCCESS_GATE and b_joint.requests < need:
        hint = f"; {load.advice(b_joint.requests, need)}" if load is not None else ""
        return Gate(
            "b_success_rate",
            f">= {B_SUCCESS_GATE:.1%}",
            rate,
            None,
            measured,
            b_joint.requests,
            need,
            f"99.9 % needs >= {need} requests to pass, not judged from {b_joint.requests}{hint}",
        )
    return Gate(
        "b_success_rate",
        f">= {B_SUCCESS_GATE:.1%}",
        rate,
        rate >= B_SUCCESS_GATE,
        measured,
        b_joint.requests,
        need,
    )


def _load_note(s: ModelStats) -> str:
    parts = [f"{s.outcomes.get('capacity', 0)} x 429, {s.outcomes.get('unavailable', 0)} x 503"]
    if s.offered_tokens_per_s is not None and s.delivered_tokens_per_s is not None:
        parts.append(
            f"delivered {s.delivered_tokens_per_s:.1f} of {s.offered_tokens_per_s:.1f} offered tokens/s "
            "during the arrivals"
        )
    return ", ".join(parts)


def verdict(gates: Sequence[Gate]) -> str:
    """FAIL if any gate failed, NOT JUDGED if any could not be judged, PASS if all passed, MEASURED with no gate."""
    if not gates:
        return "MEASURED"
    if any(g.passed is False for g in gates):
        return "FAIL"
    return NOT_JUDGED if any(g.passed is None for g in gates) else "PASS"


def failing(gates: Sequence[Gate]) -> list[Gate]:
    return [g for g in gates if g.passed is False]


def not_judged(gates: Sequence[Gate]) -> list[Gate]:
    return [g for g in gates if g.passed is None]


__all__ = [
    "B_SUCCESS_GATE",
    "B_SUCCESS_MIN_REQUESTS",
    "EFFICIENCY_GATE",
    "MIN_SAMPLES",
    "NOT_JUDGED",
    "P99_DEGRADATION_GATE",
    "Gate",
    "Load",
    "TraceEvidence",
    "b_success_gate",
    "concurrency_gates",
    "degradation_gates",
    "failing",
    "not_judged",
    "trace_gate",
    "verdict",
]
