"""The 001 §13.2 gates, each a small value with its rule, its measured value and a verdict.

=========================  ==================================================  ===========
gate                       rule                                                 001 §13.2
=========================  ==================================================  ===========
overlap_ratio              bootstrap CI lies above 0                            "置信区间不跨 0"
throughput_efficiency      >= 0.80 (steady state)                               "稳态 >= 0.80"
p99_ttft_degradation[X]    P99 TTFT of X joint <= 1.25 x isolated               "退化不超过 25%"
p99_tpot_degradation[X]    P99 TPOT of X joint <= 1.25 x isolated               "退化不超过 25%"
b_success_rate             B's success rate in the joint phase >= 99.9 %        "A 满载时 B 成功率 >= 99.9%"
=========================  ==================================================  ===========

A gate that cannot be evaluated (no samples, no interval) is ``passed=None``
with the reason: never a made-up pass. The verdict is FAIL when any evaluated
gate failed, else PASS. This module does not measure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calctl.runners.bench.metrics import Comparison, ModelStats, degradation, saturated

EFFICIENCY_GATE = 0.80
P99_DEGRADATION_GATE = 0.25
B_SUCCESS_GATE = 0.999


@dataclass(frozen=True)
class Gate:
    name: str
    rule: str
    value: float | None
    passed: bool | None  # None: not evaluated (``detail`` says why)
    detail: str = ""

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "rule": self.rule, "value": self.value, "passed": self.passed, "detail": self.detail}


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x * 100:+.1f} %" if pct else f"{x:.3f}"


def concurrency_gates(cmp: Comparison) -> list[Gate]:
    e, o = cmp.throughput_efficiency, cmp.overlap_ratio
    gates = []
    if e.mean is None:
        gates.append(Gate("throughput_efficiency", f">= {EFFICIENCY_GATE:.2f}", None, None, "no steady-state window"))
    else:
        ci = f" [95 % CI {_fmt(e.ci_low)}, {_fmt(e.ci_high)}]" if e.ci_low is not None else " (no CI)"
        gates.append(
            Gate(
                "throughput_efficiency",
                f">= {EFFICIENCY_GATE:.2f}",
                e.mean,
                e.mean >= EFFICIENCY_GATE,
                f"joint tokens/s over the sum of isolated tokens/s = {e.mean:.3f}{ci}",
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
        gates.append(
            Gate(
                "overlap_ratio",
                "CI above 0",
                o.mean,
                o.ci_low > 0,
                f"overlap_ratio {_fmt(o.mean)} [95 % CI {_fmt(o.ci_low)}, {_fmt(o.ci_high)}]"
                + ("" if o.ci_low > 0 else ": the joint run was not faster than running A and B one after the other"),
            )
        )
    return gates


def degradation_gates(iso: ModelStats, joint: ModelStats) -> list[Gate]:
    out = []
    for metric, i, j in (("ttft", iso.ttft.p99, joint.ttft.p99), ("tpot", iso.tpot.p99, joint.tpot.p99)):
        d = degradation(i, j)
        name = f"p99_{metric}_degradation[{iso.alias}]"
        rule = f"<= {P99_DEGRADATION_GATE:.0%}"
        if d is None or i is None or j is None:
            out.append(Gate(name, rule, None, None, f"no P99 {metric.upper()} in isolation or jointly"))
            continue
        out.append(
            Gate(
                name,
                rule,
                d,
                d <= P99_DEGRADATION_GATE,
                f"{iso.alias} P99 {metric.upper()} {j * 1e3:.1f} ms joint vs {i * 1e3:.1f} ms isolated ({_fmt(d, True)})",
            )
        )
    return out


def b_success_gate(a_joint: ModelStats, b_joint: ModelStats) -> Gate:
    rate = b_joint.success_rate
    sat = saturated(a_joint)
    a_note = (
        f"A ({a_joint.alias}) was saturated ({_load_note(a_joint)})"
        if sat
        else f"A ({a_joint.alias}) was not saturated ({_load_note(a_joint)}): raise --rate to test B under a saturated A"
    )
    if rate is None:
        return Gate(
            "b_success_rate", f">= {B_SUCCESS_GATE:.1%}", None, None, f"B ({b_joint.alias}) sent no request; {a_note}"
        )
    return Gate(
        "b_success_rate",
        f">= {B_SUCCESS_GATE:.1%}",
        rate,
        rate >= B_SUCCESS_GATE,
        f"B ({b_joint.alias}) {b_joint.succeeded}/{b_joint.requests} succeeded in the joint phase "
        f"({rate:.2%}); {a_note}",
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
    evaluated = [g for g in gates if g.passed is not None]
    if any(g.passed is False for g in evaluated):
        return "FAIL"
    return "PASS" if evaluated else "MEASURED"


def failing(gates: Sequence[Gate]) -> list[Gate]:
    return [g for g in gates if g.passed is False]


__all__ = [
    "B_SUCCESS_GATE",
    "EFFICIENCY_GATE",
    "P99_DEGRADATION_GATE",
    "Gate",
    "b_success_gate",
    "concurrency_gates",
    "degradation_gates",
    "failing",
    "verdict",
]
