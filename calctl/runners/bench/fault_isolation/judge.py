"""Scenario ``fault-isolation``, the judgement: B's latency and errors per phase against its baseline, the scope
of every recovery, and the grade (F0/F1/F2, 001 §13.4) with its table, picture and notes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from calctl.checks.stats import bootstrap, decide, percentiles
from calctl.runners.bench.base import (
    BenchOptions,
    ScenarioResult,
    Table,
    interrupted_note,
)
from calctl.runners.bench.fault_isolation.plan import LATENCY_GATE, LIFECYCLE, REQUEST, RUNTIME, Phase
from calctl.runners.bench.gates import MIN_SAMPLES
from calctl.runners.bench.plot import plot_timeline
from calctl.runners.device import DeviceSpec
from calctl.runners.soak.render import recovery_doc
from calctl.runners.traffic import EngineResult


@dataclass(frozen=True)
class _Baseline:
    """B in the baseline phase, and the gates the other phases are held to."""

    phase: Phase
    p99_e2e_s: float | None  # host clock: reported, never judged
    gate_s: float | None
    p99_device_s: float | None
    device_gate_s: float | None

    @classmethod
    def of(cls, base: Phase, b_results: list[EngineResult]) -> _Baseline:
        p99 = percentiles(
            [r.record.e2e for r in _b_in(b_results, base) if r.record.ok and r.record.e2e is not None]
        ).p99
        dev = percentiles(base.b_device_s).p99
        return cls(
            base,
            p99,
            p99 * (1 + LATENCY_GATE) if p99 is not None else None,
            dev,
            dev * (1 + LATENCY_GATE) if dev is not None else None,
        )


@dataclass(frozen=True)
class _Judged:
    """One phase against the baseline: its table row, its JSON, whether B was impacted, why it is undecided."""

    row: tuple[str, ...]
    doc: dict[str, Any]
    impacted: bool
    undecided: str | None  # "phase (why)": B's latency not judged and nothing else impacted B


@dataclass(frozen=True)
class _BLatency:
    """B's P99 job latency on the device's clock in one phase against the baseline's gate (``passed`` None:
    not judged, ``why`` says why)."""

    b_jobs: int
    baseline_jobs: int
    p99_s: float | None
    gate_s: float | None
    min_samples: int
    passed: bool | None = None
    why: str = ""

    def document(self) -> dict[str, Any]:
        return {"clock": "device", **dataclasses.asdict(self)}


def _latency(ph: Phase, baseline: _Baseline, reasons: list[str]) -> _BLatency:
    """B's latency on the device's clock, by the decision rule: enough jobs in the baseline and the phase for a
    P99, and its CI on one side of the gate (a failed gate adds to ``reasons``). The host's E2E is reported,
    never judged."""
    need = MIN_SAMPLES["p99"]
    base, gate = baseline.phase, baseline.device_gate_s
    latency = _BLatency(len(ph.b_device_s), len(base.b_device_s), percentiles(ph.b_device_s).p99, gate, need)
    if ph.name == "baseline":
        return latency
    if gate is None or min(len(ph.b_device_s), len(base.b_device_s)) < need:
        why = (
            f"not judged: a P99 needs >= {need} B jobs in the baseline and the phase, "
            f"had {len(base.b_device_s)} and {len(ph.b_device_s)}"
        )
        return dataclasses.replace(latency, why=why)
    d = decide(
        bootstrap(ph.b_device_s, lambda x: float(np.percentile(x, 99)), seed=7),
        gate,
        above=False,
        min_samples=need,
        what="B P99 device job latency (s)",
        fmt=".4f",
    )
    if d.passed is False:
        reasons.append(
            f"B P99 job latency on the device {(latency.p99_s or 0) * 1e3:.1f} ms > gate {gate * 1e3:.1f} ms "
            f"(baseline {(baseline.p99_device_s or 0) * 1e3:.1f} ms + 25 %): {d.why}"
        )
    return dataclasses.replace(latency, passed=d.passed, why=d.why)


def _judge_phase(ph: Phase, b_results: list[EngineResult], baseline: _Baseline) -> _Judged:
    b = _b_in(b_results, ph)
    b_ok = [r for r in b if r.record.ok]
    b_bad = [r for r in b if not r.record.ok]
    p99 = percentiles([r.record.e2e for r in b_ok if r.record.e2e is not None]).p99
    reasons = []
    if b_bad:
        classes = _counts(r.record.outcome.value for r in b_bad)
        reasons.append(f"{len(b_bad)} B request(s) failed or refused ({_fmt_counts(classes)})")
    if ph.b_events:  # any lifecycle event of B is B leaving Ready (and coming back)
        reasons.append(f"B lifecycle: {' -> '.join(e.split(' (')[0] for e in ph.b_events)}")
    latency = _latency(ph, baseline, reasons)
    undecided = (
        f"{ph.name} ({latency.why})" if ph.name != "baseline" and latency.passed is None and not reasons else None
    )
    impacted = bool(reasons) and ph.name != "baseline"
    a_seen = _fmt_counts(_counts(r.record.outcome.value for r in ph.a_results)) or "no A request"
    row = (
        ph.name,
        ph.cls,
        ph.injected,
        a_seen + (f"; {ph.faults_fired} fault(s) fired" if ph.faults_fired else ""),
        ph.scope,
        f"{len(b_ok)}/{len(b)}",
        "n/a" if p99 is None else f"{p99 * 1e3:.0f} ms",
        "YES: " + "; ".join(reasons) if impacted else "no",
    )
    doc = {
        "phase": ph.name,
        "class": ph.cls,
        "injected_on_a": ph.injected,
        "a_outcomes": _counts(r.record.outcome.value for r in ph.a_results),
        "a_device_jobs": ph.a_jobs,
        "faults_fired": ph.faults_fired,
        "scope_granted": ph.scope,
        "recoveries": [recovery_doc(r) for r in ph.recoveries],
        "b_requests": len(b),
        "b_succeeded": len(b_ok),
        "b_outcomes": _counts(r.record.outcome.value for r in b),
        "b_p99_e2e_s": p99,
        "b_p99_e2e_note": "host clock (what B's clients waited, host overhead included): reported, never judged",
        "b_latency": latency.document(),
        "b_lifecycle": ph.b_events,
        "b_impacted": impacted,
        "b_impact": reasons if impacted else [],
        "seconds": round(ph.end - ph.start, 3),
        "note": ph.note,
    }
    return _Judged(row, doc, impacted, undecided)


def _grade(phases: list[Phase], judged: list[_Judged]) -> tuple[str, str, str]:
    """(grade, verdict, why): the grade B's impacts give (001 §13.4), and NOT JUDGED when a phase whose latency
    was not judged could still lower it (the decision rule)."""
    impacted: dict[str, list[str]] = {REQUEST: [], RUNTIME: [], LIFECYCLE: []}
    undecided: dict[str, list[str]] = {REQUEST: [], RUNTIME: [], LIFECYCLE: []}
    for ph, j in zip(phases, judged, strict=True):
        if j.impacted:
            impacted[ph.cls].append(ph.name)
        if j.undecided is not None:
            undecided[ph.cls].append(j.undecided)
    if impacted[REQUEST]:
        grade = "F0"
        why = (
            f"request/resource faults on A impacted B ({', '.join(impacted[REQUEST])}): A and B share "
            "even the request-level fault domain"
        )
    elif impacted[RUNTIME] or impacted[LIFECYCLE]:
        grade = "F1"
        why = (
            "request and resource faults on A were isolated from B; "
            + "; ".join(
                f"{cls} faults impacted B ({', '.join(v)})" for cls, v in impacted.items() if v and cls != REQUEST
            )
            + ": a shared fault domain (001 §13.4)"
        )
    else:
        grade = "F2"
        why = "no fault or lifecycle action on A impacted B (chip-scoped recovery, B untouched)"
    could_lower = undecided[REQUEST] if grade != "F0" else []
    if grade == "F2":
        could_lower = could_lower + undecided[RUNTIME] + undecided[LIFECYCLE]
    if not could_lower:
        return grade, grade, why
    return (
        grade,
        "NOT JUDGED",
        f"{grade} at best: B's device latency not judged in {'; '.join(could_lower)}; "
        "a longer phase or a less loaded host would decide it",
    )


#: The columns of the evidence table, one row a phase.
COLUMNS = ("phase", "class", "injected on A", "A saw", "scope the runtime granted", "B ok", "B P99 E2E", "B impacted")


def scenario_result(
    opts: BenchOptions,
    a_alias: str,
    b_alias: str,
    phases: list[Phase],
    b_results: list[EngineResult],
    *,
    running: str,
    t_start: float,
    device: DeviceSpec,
    interrupt: KeyboardInterrupt | None = None,
) -> ScenarioResult:
    """The graded report; with ``interrupt``, the report of the phases finished before the signal
    (verdict INTERRUPTED, exit 130, nothing graded)."""
    baseline = _Baseline.of(phases[0], b_results)
    judged = [_judge_phase(ph, b_results, baseline) for ph in phases]
    grade, verdict_grade, why = _grade(phases, judged)
    if interrupt is not None:
        verdict_grade = "INTERRUPTED"
        why = interrupted_note(interrupt, running, [p.name for p in phases])
    notes = [
        why if interrupt is not None else f"grade {verdict_grade}: {why}",
        "MOCK RESULT: faults injected on the simulated board; this grades the tool and "
        "the engine's isolation logic, not a Calculet board's fault domains (docs/runtime.md §5)",
        "not exercised: KV corruption (silent on the device; only golden checks see it)",
    ]
    plot = opts.out_dir / "bench.png"
    plot_timeline(
        plot,
        points=[(r.record.sent - t_start, r.record.e2e, r.record.ok) for r in b_results],
        phases=[(p.name, p.start - t_start, p.end - t_start) for p in phases],
        gate_s=baseline.gate_s,
        title=f"calctl bench fault-isolation: {grade if interrupt is None else verdict_grade} "
        f"(B = {b_alias}, faults on A = {a_alias})",
        device="mock",
    )
    base_p99 = baseline.p99_e2e_s
    table = Table(
        f"fault isolation evidence (A = {a_alias}, B = {b_alias}; B baseline P99 E2E "
        f"{'n/a' if base_p99 is None else f'{base_p99 * 1e3:.0f} ms'})",
        COLUMNS,
        tuple(j.row for j in judged),
    )
    body = {
        "grade": verdict_grade,
        "grade_reason": why,
        "a": a_alias,
        "b": b_alias,
        "phases": [j.doc for j in judged],
        "b_baseline_p99_e2e_s": base_p99,
        "b_baseline_p99_device_s": baseline.p99_device_s,
        "b_device_latency_gate_s": baseline.device_gate_s,
        "b_latency_gate_s": baseline.gate_s,
        "device_options": device.describe(),
        **(
            {"interrupted_in": running or None, "phases_finished": [p.name for p in phases]}
            if interrupt is not None
            else {}
        ),
        "rules": {
            "F0": "a request/resource fault on A impacted B",
            "F1": "request/resource isolated; a runtime fault or lifecycle action on A impacted B",
            "F2": "nothing on A impacted B",
        },
    }
    return ScenarioResult("fault-isolation", verdict_grade, (), (table,), body, plot, tuple(notes), mock_result=True)


def _b_in(b_results: list[EngineResult], ph: Phase) -> list[EngineResult]:
    """B's requests sent during ``ph``."""
    return [r for r in b_results if ph.start <= r.record.sent < ph.end]


def _counts(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _fmt_counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
