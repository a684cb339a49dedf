"""The acceptance rows: gates G0–G5 (001 §17) and milestones M0–M4 (000 §19), judged from evidence.

Each row is a :class:`RowSpec` (id, title, the report's condition with its
section, the report's No-Go action) and a judge: a pure function from the
evidence steps of a run (:class:`StepEvidence`, by name) to a
:class:`RowResult` with a verdict **GO**, **NO-GO** or **NOT MEASURED**.

Rules every judge keeps:

* a row whose evidence step did not run (skipped, not applicable, interrupted,
  ended in an error) is NOT MEASURED with why and what would measure it;
* a requirement of duration or count that was not reached (24 h, 100 cycles,
  8 h of switching) is NOT MEASURED with what was reached, unless what was
  measured already failed (then NO-GO);
* a NO-GO carries the report's action (001 §17 column 3; for M rows the
  consequence 000 §19 states).

:func:`require_evidence_files` is applied last, when a report is rendered:
a GO whose evidence files are not all present in the report directory becomes
NOT MEASURED naming the missing file. Nothing is GO on the word of a document.

This module does no I/O except that existence check, runs nothing and prints nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


class Verdict(str, enum.Enum):
    GO = "GO"
    NO_GO = "NO-GO"
    NOT_MEASURED = "NOT MEASURED"


class StepStatus(str, enum.Enum):
    """How an evidence step ended. Only RAN carries evidence a row may judge."""

    RAN = "RAN"  # it ran to the end; its document holds what it measured (a failing measurement included)
    SKIPPED = "SKIPPED"  # it does not apply to this run (the reason says why and what would make it apply)
    ERROR = "ERROR"  # it could not measure (device error, timeout, a refused package)
    INTERRUPTED = "INTERRUPTED"  # SIGINT/SIGTERM before or while it ran
    PENDING = "PENDING"  # not reached yet (a checkpoint of a run still going)


@dataclass(frozen=True)
class StepEvidence:
    """One evidence step of an acceptance run: its status, its own document and the files it kept.

    ``files`` maps a label to a path relative to the report directory.
    """

    name: str
    status: StepStatus
    seconds: float = 0.0
    summary: str = ""
    reason: str = ""  # SKIPPED / ERROR / INTERRUPTED: why
    document: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def ran(self) -> bool:
        return self.status is StepStatus.RAN

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "seconds": round(self.seconds, 3),
            "summary": self.summary,
            "reason": self.reason,
            "files": dict(self.files),
        }


@dataclass(frozen=True)
class RowSpec:
    id: str
    title: str
    condition: str  # the report's Go condition, paraphrased, with its section
    source: str
    no_go_action: str  # 001 §17 column 3, or the consequence 000 §19 states
    steps: tuple[str, ...]  # the evidence steps the row reads
    measured_by: str  # the command that measures it on its own (docs/accept.md)


@dataclass(frozen=True)
class RowResult:
    id: str
    title: str
    condition: str
    source: str
    verdict: Verdict
    key_figure: str  # the one figure a person looks at first
    evidence: tuple[str, ...] = ()  # figures, with CIs where the source gives them
    files: dict[str, str] = field(default_factory=dict)  # label -> path relative to the report directory
    reason: str = ""  # NO-GO: what failed; NOT MEASURED: why not
    how_to_measure: str = ""  # NOT MEASURED: what would measure it
    action: str = ""  # NO-GO: the report's action
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "condition": self.condition,
            "source": self.source,
            "verdict": self.verdict.value,
            "key_figure": self.key_figure,
            "evidence": list(self.evidence),
            "files": dict(self.files),
            "reason": self.reason,
            "how_to_measure": self.how_to_measure,
            "action": self.action if self.verdict is Verdict.NO_GO else "",
            "data": self.data,
        }


Steps = Mapping[str, StepEvidence]

# ---------------------------------------------------------------------------
# The rows

ACCEPT_LONG = "`calctl accept PKG --level long`"
REPLICA_HINT = (
    "needs a replica package (one model on both chips): `calctl sample-package --kind replica --key K OUT` "
    "or `calctl combine --replica ...`, then `calctl accept PKG --replica OUT`"
)

G0 = RowSpec(
    "G0",
    "per-chip capacity",
    "static budget and the load peak both leave the guard on every chip: static <= 80 % of the chip's DRAM and "
    "reserve >= max(1 GiB, 15 %), each chip on its own (001 §17 G0, §8.2)",
    "001 §17, §8",
    "shrink the model, context or batch; never force it in (001 §17: 缩模型/context/batch，禁止硬塞)",
    ("budget", "load-peak"),
    "`calctl budget PKG`; device memory at load: `calctl accept`",
)
G1 = RowSpec(
    "G1",
    "per-chip correctness",
    "golden passes on chip 0 and on chip 1, each on its own (001 §17 G1, §12 Phase 1, §13.1)",
    "001 §17, §12 Phase 1",
    "back to compiler/kernel debugging (001 §17: 回到 compiler/kernel 调试)",
    ("run-golden", "replica-golden"),
    "`calctl run-golden PKG`",
)
G2 = RowSpec(
    "G2",
    "replica isolation",
    "A0 on chip 0 and A1 on chip 1: at least 1,000 requests (different prompts, lengths, cancellation times) "
    "without buffer, KV, job or sequence-id crosstalk (001 §17 G2, §12 Phase 2, §13.1)",
    "001 §17, §12 Phase 2, §13.1",
    "do not enter the different-models phase (001 §17: 不进入不同模型阶段)",
    ("isolation",),
    "`calctl bench REPLICA --scenario isolation`",
)
G3 = RowSpec(
    "G3",
    "S2 concurrency",
    "the per-chip trace shows chip 0 and chip 1 computing together, overlap_ratio's CI above 0 and "
    "throughput_efficiency >= 0.80 (001 §17 G3, §13.2)",
    "001 §17, §13.2",
    "declare S1 only, investigate the global runtime lock / shared bottleneck (001 §17: 只声明 S1，调查全局锁/共享瓶颈)",
    ("poc",),
    "`calctl poc combined PKG --expect-models A,B`",
)
G4 = RowSpec(
    "G4",
    "fault domain",
    "at least F1 (request and resource faults isolated; CCU/timeout/reset may share the fault domain) and a "
    "deterministic recovery: every recovery succeeded and both models were Ready again (001 §17 G4, §13.4)",
    "001 §17, §13.4",
    "bind both aliases to one health state and take them out of service together "
    "(001 §17: 两 alias 绑定同一健康状态并同时摘流)",
    ("fault-isolation",),
    "`calctl bench PKG --scenario fault-isolation` (mock)",
)
G5 = RowSpec(
    "G5",
    "production",
    "24 h mixed soak, 100 lifecycle cycles and the rollback to the previous version (under traffic) all pass "
    "(001 §17 G5, §12 Phase 5, §13.3)",
    "001 §17, §13.3",
    "keep the single-model or the two-board plan (001 §17: 保留单模型或两板方案)",
    ("soak", "rollback"),
    "`calctl soak PKG --hours 24`; `calctl accept PKG --previous OLD_PKG` for the rollback",
)
M0 = RowSpec(
    "M0",
    "B1 stable",
    "a B1 package serves 24 h with no abort, busy-wait, crosstalk or leak, every error code visible (000 §19 M0)",
    "000 §19 M0",
    "B1 is not stable: fix it before building M1–M4 on it (000 §19 M0)",
    ("soak",),
    "`calctl soak PKG --hours 24`",
)
M1 = RowSpec(
    "M1",
    "async in-flight = 1",
    "behaviour equivalent to the synchronous baseline, P50 regression <= 3 %, P99 <= 5 % (000 §19 M1)",
    "000 §19 M1",
    "keep the synchronous executor: async in-flight=1 is not enabled (000 §19 M1)",
    ("executor-modes",),
    "`calctl bench PKG --scenario executor-modes`",
)
M2 = RowSpec(
    "M2",
    "ping/pong",
    "aggregate throughput +10 % or more, P99 regression <= 5 %, and 24 h without errors (000 §19 M2)",
    "000 §19 M2",
    "ping/pong is not enabled by default (000 §19 M2: 才默认启用)",
    ("executor-modes", "soak"),
    "`calctl bench PKG --scenario executor-modes`, then a 24 h soak",
)
M3 = RowSpec(
    "M3",
    "batch",
    "every lane correct, fill ratio / throughput / P99 meet the project's targets, a KV fault recoverable (000 §19 M3)",
    "000 §19 M3",
    "do not advertise continuous batching (000 §19 M3: 没有这些数据不宣传 continuous batching)",
    ("batch",),
    "`calctl bench PKG --scenario batch`",
)
M4 = RowSpec(
    "M4",
    "multi-model lifecycle",
    "100 load/unload cycles, an 8 h model-switching soak, resources back to baseline, generation isolation, "
    "one-call rollback to the old version (000 §19 M4)",
    "000 §19 M4",
    "no multi-model lifecycle in production: keep the resident set fixed, no hot load/unload or switching (000 §19 M4)",
    ("soak", "rollback"),
    "`calctl soak PKG --cycles 100` and `--hours 8`; `calctl accept PKG --previous OLD_PKG` for the rollback",
)

ROWS: tuple[RowSpec, ...] = (G0, G1, G2, G3, G4, G5, M0, M1, M2, M3, M4)

#: Requirements of duration and count (001 §13.3, 000 §19).
SOAK_HOURS_G5 = 24.0
LIFECYCLE_CYCLES = 100
SOAK_HOURS_M0 = 24.0
SOAK_HOURS_M2 = 24.0
SWITCH_HOURS_M4 = 8.0
ISOLATION_REQUESTS = 1000


# ---------------------------------------------------------------------------
# Helpers


def _result(spec: RowSpec, verdict: Verdict, key: str, **kw: Any) -> RowResult:
    action = spec.no_go_action if verdict is Verdict.NO_GO else ""
    return RowResult(spec.id, spec.title, spec.condition, spec.source, verdict, key, action=action, **kw)


def not_measured(spec: RowSpec, reason: str, how: str, **kw: Any) -> RowResult:
    return _result(spec, Verdict.NOT_MEASURED, kw.pop("key", "not measured"), reason=reason, how_to_measure=how, **kw)


def _missing(spec: RowSpec, steps: Steps, *names: str) -> RowResult | None:
    """NOT MEASURED when a step the row needs did not run, with the step's own reason."""
    for name in names:
        s = steps.get(name)
        if s is None or s.status is StepStatus.PENDING:
            return not_measured(spec, f"{name}: not reached", f"let the run reach {name}: {spec.measured_by}")
        if not s.ran:
            what = {
                StepStatus.SKIPPED: "not run",
                StepStatus.ERROR: "could not measure",
                StepStatus.INTERRUPTED: "interrupted",
            }[s.status]
            how = s.document.get("how_to_measure") or spec.measured_by
            return not_measured(spec, f"{name} {what}: {s.reason}", how)
    return None


def _files(*steps: StepEvidence | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in steps:
        if s is not None:
            out.update({f"{s.name}.{k}": v for k, v in s.files.items()})
    return out


def _est(d: Mapping[str, Any] | None, fmt: str = ".3f") -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    lo, hi = d.get("ci_low"), d.get("ci_high")
    ci = f" [{lo:{fmt}}, {hi:{fmt}}] 95 % CI" if lo is not None and hi is not None else " (no CI)"
    return f"{d['mean']:{fmt}}{ci}"


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.3f} GiB"


# ---------------------------------------------------------------------------
# Judges


def judge_g0(steps: Steps) -> RowResult:
    spec = G0
    budget = steps.get("budget")
    if budget is not None and budget.ran and budget.document.get("verdict") == "NO-GO":
        chips = [c for c in budget.document.get("chips", []) if c.get("verdict") != "GO"]
        reasons = "; ".join(f"chip {c['chip']}: {'; '.join(c.get('reasons', []))}" for c in chips)
        return _result(
            spec, Verdict.NO_GO, "static budget NO-GO", reason=reasons or "budget NO-GO", files=_files(budget)
        )
    miss = _missing(spec, steps, "budget", "load-peak")
    if miss:
        return miss
    assert budget is not None
    peak = steps["load-peak"]
    per_chip = {int(c["chip"]): c for c in budget.document.get("chips", [])}
    evidence, failing, unknown = [], [], []
    for m in peak.document.get("chips", []):
        chip, used = int(m["chip"]), m.get("used_bytes")
        plan = per_chip.get(chip)
        if plan is None:
            continue
        limit, guard, dram = plan["limit_bytes"], plan["guard_bytes"], plan["dram_bytes"]
        if used is None:
            unknown.append(chip)
            continue
        fits = used <= limit and dram - used >= guard
        evidence.append(
            f"chip {chip}: static {_gib(plan['static_bytes'])}, device memory at load {_gib(used)} "
            f"(limit {_gib(limit)}, reserve {_gib(dram - used)} >= guard {_gib(guard)}: {'yes' if fits else 'NO'})"
        )
        if not fits:
            failing.append(chip)
    files = _files(budget, peak)
    loads = [m for m in peak.document.get("chips", []) if m.get("used_bytes") is not None]
    key = (
        "at load: " + ", ".join(f"chip {m['chip']} {_gib(m['used_bytes'])}" for m in loads)
        if loads
        else "no chip measured"
    )
    if per_chip:
        key += f" (limit {_gib(min(c['limit_bytes'] for c in per_chip.values()))})"
    if failing:
        return _result(
            spec,
            Verdict.NO_GO,
            key,
            evidence=tuple(evidence),
            files=files,
            reason=f"device memory at load leaves less than the guard on chip {', '.join(map(str, failing))}",
        )
    if unknown or not evidence:
        return not_measured(
            spec,
            f"the device reports no per-chip memory for chip {', '.join(map(str, unknown)) or 'any'}",
            "a runtime that answers GetMemoryUsage per chip (docs/calrt-c-abi.md)",
            evidence=tuple(evidence),
            files=files,
        )
    return _result(spec, Verdict.GO, key, evidence=tuple(evidence), files=files)


def _board_chips(steps: Steps) -> int:
    """The board's chip count: from the load (the device's own answer), else the budget, else 2 (001 §2.1)."""
    peak, budget = steps.get("load-peak"), steps.get("budget")
    if peak is not None and peak.ran and peak.document.get("chips"):
        return len(peak.document["chips"])
    if budget is not None and budget.ran and (budget.document.get("device") or {}).get("chips"):
        return int(budget.document["device"]["chips"])
    return 2


def judge_g1(steps: Steps) -> RowResult:
    spec = G1
    miss = _missing(spec, steps, "run-golden")
    if miss:
        return miss
    chips = _board_chips(steps)
    runs = [s for s in (steps.get("run-golden"), steps.get("replica-golden")) if s is not None and s.ran]
    passed: dict[int, list[str]] = {c: [] for c in range(chips)}
    failing: dict[int, list[str]] = {}
    failed: list[str] = []
    for s in runs:
        for m in s.document.get("per_model", []):
            label = f"{m['alias']} ({s.document.get('package_name') or s.name})"
            for chip in m.get("chips", []):
                if m.get("ok"):
                    passed.setdefault(int(chip), []).append(label)
                else:
                    passed.setdefault(int(chip), [])
                    failing.setdefault(int(chip), []).append(label)
                    failed.append(f"{label} on chip {chip}: {m.get('reason') or 'golden mismatch'}")

    def chip_line(c: int, ok: list[str]) -> str:
        bad = failing.get(c, [])
        if bad:
            return f"chip {c}: " + ", ".join(bad) + " golden MISMATCH" + (f" ({', '.join(ok)} exact)" if ok else "")
        return f"chip {c}: " + (", ".join(ok) + " golden exact" if ok else "no model ran")

    evidence = tuple(chip_line(c, v) for c, v in sorted(passed.items()))
    files = _files(*runs)
    # A chip is exact only when a model ran on it and every model that ran on it matched its golden.
    exact = sum(1 for c, v in passed.items() if v and not failing.get(c))
    key = f"{exact}/{len(passed)} chips golden exact"
    if failed:
        return _result(spec, Verdict.NO_GO, key, evidence=evidence, files=files, reason="; ".join(failed))
    empty = [c for c, v in passed.items() if not v]
    if empty:
        return not_measured(
            spec,
            f"no model of the package(s) runs on chip {', '.join(map(str, empty))}",
            "a package with a model on that chip (the chip-1 build, a combined package, or `--replica PKG`)",
            key=key,
            evidence=evidence,
            files=files,
        )
    return _result(spec, Verdict.GO, key, evidence=evidence, files=files)


def judge_g2(steps: Steps) -> RowResult:
    """From the ``isolation`` scenario: ``requests.sent``, ``checks`` {name: {pass, fail}}, ``crosstalk`` offenders."""
    spec = G2
    miss = _missing(spec, steps, "isolation")
    if miss:
        return miss
    s = steps["isolation"]
    doc = s.document
    requests = doc.get("requests") or {}
    n = requests.get("sent") if isinstance(requests, dict) else requests
    offenders = doc.get("crosstalk") or []
    checks = doc.get("checks") or {}
    failing = [name for name, c in checks.items() if c.get("fail")]
    key = f"{n if n is not None else 'n/a'} requests, {len(offenders)} offender(s)"
    evidence = tuple(f"{name}: {c.get('pass', 0)} passed, {c.get('fail', 0)} failed" for name, c in checks.items())
    if isinstance(requests, dict) and requests.get("sent") is not None:
        evidence = (
            f"{requests.get('sent')} sent: {requests.get('completed')} completed, "
            f"{requests.get('cancelled')} cancelled, {requests.get('failed')} failed, "
            f"{requests.get('timed_out', 0)} timed out (a load outcome)",
            *evidence,
        )
    if offenders or failing or doc.get("verdict") in ("NO-GO", "FAIL"):
        named = [
            f"{o.get('request_id')} ({o.get('alias')}, chip {o.get('chip')}) {o.get('check')}: {o.get('detail')}"
            if isinstance(o, dict)
            else str(o)
            for o in offenders[:3]
        ]
        why = "; ".join(named) or f"failing checks: {', '.join(failing)}"
        return _result(spec, Verdict.NO_GO, key, evidence=evidence, files=_files(s), reason=why)
    timed_out = requests.get("timed_out") if isinstance(requests, dict) else None
    if timed_out or doc.get("verdict") == "NOT JUDGED":
        return not_measured(
            spec,
            f"no crosstalk in what was verified, but {timed_out} request(s) timed out: a load outcome of the host "
            "or the device, not isolation evidence either way; fewer than the requests asked for were verified",
            "rerun on a host that is not saturated, or with a longer `--request-timeout`",
            key=key,
            evidence=evidence,
            files=_files(s),
        )
    if not isinstance(n, int) or n < ISOLATION_REQUESTS:
        return not_measured(
            spec,
            f"{n} requests checked, the gate needs at least {ISOLATION_REQUESTS} (001 §13.1)",
            "`calctl bench REPLICA --scenario isolation --requests 1000`",
            key=key,
            evidence=evidence,
            files=_files(s),
        )
    return _result(spec, Verdict.GO, key, evidence=evidence, files=_files(s))


def judge_g3(steps: Steps) -> RowResult:
    spec = G3
    miss = _missing(spec, steps, "poc")
    if miss:
        return miss
    s = steps["poc"]
    doc = s.document
    verdict = doc.get("verdict")
    busy = doc.get("both_busy_fraction")
    evidence = (
        f"overlap_ratio {_est(doc.get('overlap_ratio'))}",
        f"throughput_efficiency {_est(doc.get('throughput_efficiency'))}",
        "both chips computing " + ("n/a" if busy is None else f"{busy:.0%}") + " of the joint wall time",
        *doc.get("reasons", []),
    )
    o = doc.get("overlap_ratio") or {}
    e = doc.get("throughput_efficiency") or {}
    key = f"{verdict}: overlap {_est(o, '.2f')}, efficiency {_est(e, '.2f')}"
    if verdict == "S2":
        return _result(spec, Verdict.GO, key, evidence=evidence, files=_files(s))
    if verdict == "NOT JUDGED":  # the decision rule: an interval still straddles its gate after the budget
        rounds = doc.get("rounds_run") or len(doc.get("rounds") or [])
        return not_measured(
            spec,
            f"not judged after {rounds} rounds: " + ("; ".join(doc.get("reasons", [])) or "an interval straddles"),
            "more PoC rounds (`--level standard` or `long`), on a host that is not saturated",
            key=key,
            evidence=evidence,
            files=_files(s),
        )
    if verdict == "S1":
        why = "; ".join(doc.get("reasons", [])) or "the chips did not compute together"
        if (doc.get("device_options") or {}).get("serialize_chips"):
            why = f"--serialize-chips (a modelled global runtime lock): {why}"
        return _result(spec, Verdict.NO_GO, key, evidence=evidence, files=_files(s), reason=why)
    return _result(
        spec,
        Verdict.NO_GO,
        key,
        evidence=evidence,
        files=_files(s),
        reason=f"the PoC ended {verdict}: {doc.get('error') or 'outputs did not match'}",
    )


def judge_g4(steps: Steps) -> RowResult:
    spec = G4
    miss = _missing(spec, steps, "fault-isolation")
    if miss:
        return miss
    s = steps["fault-isolation"]
    doc = s.document
    grade = doc.get("grade")
    phases = doc.get("phases", [])
    failed_recoveries = [
        f"{p['phase']}: {r['scope']} reset for {r['reason']} of {r['alias']} FAILED"
        for p in phases
        for r in p.get("recoveries", [])
        if not r.get("ok")
    ]
    not_ready = [f"{p['phase']}: {p['note']}" for p in phases if p.get("note")]
    evidence = tuple(
        f"{p['phase']} ({p['class']}): {p['scope_granted']}; B {p['b_succeeded']}/{p['b_requests']} ok"
        + (", B impacted" if p.get("b_impacted") else "")
        for p in phases
    )
    hit = [p["phase"] for p in phases if p.get("b_impacted")]
    key = f"{grade}: B impacted in {', '.join(hit)}" if hit else f"{grade}: B never impacted"
    data = {"grade": grade, "plan": (doc.get("device_options") or {}).get("fault_plan")}
    if grade == "F0":
        return _result(
            spec, Verdict.NO_GO, key, evidence=evidence, files=_files(s), reason=doc.get("grade_reason", ""), data=data
        )
    if failed_recoveries or not_ready:
        return _result(
            spec,
            Verdict.NO_GO,
            key,
            evidence=evidence,
            files=_files(s),
            reason="recovery not deterministic: " + "; ".join(failed_recoveries + not_ready),
            data=data,
        )
    if grade in ("F1", "F2"):
        return _result(spec, Verdict.GO, key, evidence=evidence, files=_files(s), data=data)
    if grade == "NOT JUDGED":  # the decision rule: B's device latency undecided in a phase that could lower it
        return not_measured(
            spec,
            f"not judged: {doc.get('grade_reason', '')}",
            "a longer fault-isolation run (`--level standard`) on a host that is not saturated",
            key=key,
            evidence=evidence,
            files=_files(s),
            data=data,
        )
    return not_measured(spec, f"the scenario gave no grade ({grade})", spec.measured_by, files=_files(s))


def _soak_reached(doc: Mapping[str, Any]) -> tuple[int, float, int]:
    return int(doc.get("cycles") or 0), float(doc.get("seconds") or 0.0) / 3600.0, len(doc.get("violations", []))


def _soak_evidence(doc: Mapping[str, Any]) -> tuple[str, ...]:
    cycles, hours, v = _soak_reached(doc)
    drift = (doc.get("memory") or {}).get("max_drift_bytes") or {}
    from calctl.runners.soak.wording import RequestCounts

    req = RequestCounts.of_report(doc.get("requests") or {})
    return (
        f"{cycles} load/unload cycles in {hours:.2f} h, requests {req.phrase()}, {v} violation(s)",
        "max memory drift after unload: "
        + (", ".join(f"chip {c} {'n/a' if b is None else f'{b / 2**20:+.1f} MiB'}" for c, b in drift.items()) or "n/a"),
        *[str(x.get("message")) for x in doc.get("violations", [])[:3]],
    )


def _soak_failure(doc: Mapping[str, Any]) -> str | None:
    violations = doc.get("violations", [])
    if violations:
        return "; ".join(str(v.get("message")) for v in violations[:3])
    if doc.get("status") == "aborted":
        return f"the soak aborted: {doc.get('error') or 'see soak-report.json'}"
    return None


def _rollback_failure(rb: StepEvidence | None) -> str | None:
    if rb is None or not rb.ran:
        return None
    return None if rb.document.get("ok") else f"rollback failed: {rb.document.get('detail')}"


def _judge_soak_rows(spec: RowSpec, steps: Steps, hours_needed: float, what: str, key: str) -> RowResult:
    """G5 and M4 read the soak and the rollback alike: NO-GO on a failure of either (whatever was reached),
    NOT MEASURED while the soak is missing, its cycles / hours are short of the row's or the rollback to the
    previous version was not exercised (no ``--previous``: each said, with how to measure it), else GO.
    ``what`` follows the hours in the reason (``""``, ``" of switching"``); ``key`` is formatted with
    ``cycles``, ``hours`` and ``rollback``."""
    soak, rb = steps.get("soak"), steps.get("rollback")
    fails = [f for f in (_soak_failure(soak.document) if soak and soak.ran else None, _rollback_failure(rb)) if f]
    if fails:
        return _result(
            spec,
            Verdict.NO_GO,
            "soak or rollback failed",
            evidence=_soak_evidence(soak.document) if soak and soak.ran else (),
            files=_files(soak, rb),
            reason="; ".join(fails),
        )
    miss = _missing(spec, steps, "soak")
    if miss:
        return miss
    assert soak is not None
    rb_miss = _missing(spec, steps, "rollback")
    cycles, hours, _ = _soak_reached(soak.document)
    rb_said = f"rollback: {rb.summary}" if rb is not None and rb.ran else f"NOT MEASURED: {rb_miss and rb_miss.reason}"
    evidence = (*_soak_evidence(soak.document), rb_said)
    key = key.format(cycles=cycles, hours=hours, rollback="rollback not measured" if rb_miss else "rollback ok")
    files = _files(soak, rb) if rb is not None and rb.ran else _files(soak)
    short = cycles < LIFECYCLE_CYCLES or hours < hours_needed
    if short or rb_miss:
        reasons = []
        if short:
            reasons.append(
                f"soak ran {cycles}/{LIFECYCLE_CYCLES} cycles, {hours:.2f} h/{hours_needed:g} h{what} (no failure so far)"
            )
        if rb_miss:
            reasons.append(rb_miss.reason)
        how = rb_miss.how_to_measure if rb_miss else ""
        if short and how.startswith("`calctl accept PKG --previous"):
            how = how.replace("`calctl accept PKG", "`calctl accept PKG --level long", 1)
        elif short:
            how = ACCEPT_LONG + (f"; and {how}" if how else "")
        return not_measured(spec, "; ".join(reasons), how, key=key, evidence=evidence, files=files)
    return _result(spec, Verdict.GO, key, evidence=evidence, files=files)


def judge_g5(steps: Steps) -> RowResult:
    key = f"soak {{cycles}}/{LIFECYCLE_CYCLES} cycles, {{hours:.2f}}/{SOAK_HOURS_G5:g} h; {{rollback}}"
    return _judge_soak_rows(G5, steps, SOAK_HOURS_G5, "", key)


def judge_m0(steps: Steps) -> RowResult:
    spec = M0
    soak = steps.get("soak")
    if soak is not None and soak.ran and (why := _soak_failure(soak.document)):
        return _result(
            spec, Verdict.NO_GO, "soak failed", evidence=_soak_evidence(soak.document), files=_files(soak), reason=why
        )
    miss = _missing(spec, steps, "soak")
    if miss:
        return miss
    assert soak is not None
    cycles, hours, _ = _soak_reached(soak.document)
    profiles = soak.document.get("decode_profiles") or {}
    not_b1 = [a for a, p in profiles.items() if 1 not in p]
    key = f"soak {hours:.2f}/{SOAK_HOURS_M0:g} h, 0 violations"
    if not_b1:
        return not_measured(
            spec,
            f"{', '.join(not_b1)} compile no B1 decode profile: M0 is a B1 milestone",
            "a package with a B1 decode graph",
            key=key,
            files=_files(soak),
        )
    if hours < SOAK_HOURS_M0:
        return not_measured(
            spec,
            f"soak ran {hours:.2f} h/{SOAK_HOURS_M0:g} h ({cycles} cycles, no violation so far)",
            ACCEPT_LONG + " or `calctl soak PKG --hours 24`",
            key=key,
            evidence=_soak_evidence(soak.document),
            files=_files(soak),
        )
    return _result(spec, Verdict.GO, key, evidence=_soak_evidence(soak.document), files=_files(soak))


def _milestone(doc: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    runs = doc.get("runs") or []
    if not runs:
        return None
    m = runs[0].get(name)
    return m if isinstance(m, dict) else None


def _milestone_evidence(m: Mapping[str, Any]) -> tuple[str, ...]:
    said = {True: "met", False: "not met", None: "inconclusive"}
    return tuple(f"{c['name']}: {_est(c, '+.3f')} ({c['rule']}): {said[c['passed']]}" for c in m.get("checks", []))


def _inconclusive(m: Mapping[str, Any]) -> str:
    """Which checks of a milestone were undecided, and why (an interval across the limit, a saturated host)."""
    open_ = [f"{c['name']}: {c.get('detail', '')}" for c in m.get("checks", []) if c.get("passed") is None]
    return "; ".join(open_) or "a confidence interval straddles its limit"


def judge_m1(steps: Steps) -> RowResult:
    spec = M1
    miss = _missing(spec, steps, "executor-modes")
    if miss:
        return miss
    s = steps["executor-modes"]
    m = _milestone(s.document, "M1")
    if m is None:
        return not_measured(spec, "executor-modes reported no M1", spec.measured_by, files=_files(s))
    ev = _milestone_evidence(m)
    key = f"M1 {m['verdict']}"
    if m["verdict"] == "met":
        return _result(spec, Verdict.GO, key, evidence=ev, files=_files(s))
    if m["verdict"] == "not met":
        failed = [c["name"] for c in m.get("checks", []) if c.get("passed") is False]
        return _result(spec, Verdict.NO_GO, key, evidence=ev, files=_files(s), reason=f"not met: {', '.join(failed)}")
    return not_measured(
        spec,
        "inconclusive: " + _inconclusive(m),
        "more rounds: `calctl bench PKG --scenario executor-modes` at `--level standard` or longer, "
        "on a host that is not saturated",
        key=key,
        evidence=ev,
        files=_files(s),
    )


def judge_m2(steps: Steps) -> RowResult:
    spec = M2
    miss = _missing(spec, steps, "executor-modes")
    if miss:
        return miss
    s, soak = steps["executor-modes"], steps.get("soak")
    m = _milestone(s.document, "M2")
    if m is None:
        return not_measured(spec, "executor-modes reported no M2", spec.measured_by, files=_files(s))
    ev = _milestone_evidence(m)
    key = f"M2 {m['verdict']}"
    if m["verdict"] == "not met":
        failed = [c["name"] for c in m.get("checks", []) if c.get("passed") is False]
        return _result(spec, Verdict.NO_GO, key, evidence=ev, files=_files(s), reason=f"not met: {', '.join(failed)}")
    if m["verdict"] != "met":
        return not_measured(
            spec,
            "inconclusive: " + _inconclusive(m),
            "more rounds: `calctl bench PKG --scenario executor-modes`, on a host that is not saturated",
            key=key,
            evidence=ev,
            files=_files(s),
        )
    pingpong_hours = 0.0
    if soak is not None and soak.ran and soak.document.get("executor_mode") == "pingpong":
        if why := _soak_failure(soak.document):
            return _result(spec, Verdict.NO_GO, key, evidence=ev, files=_files(s, soak), reason=why)
        pingpong_hours = _soak_reached(soak.document)[1]
    if pingpong_hours < SOAK_HOURS_M2:
        return not_measured(
            spec,
            f"throughput and P99 met; 24 h without errors under ping/pong not reached "
            f"({pingpong_hours:.2f} h/{SOAK_HOURS_M2:g} h of ping/pong soak)",
            "a 24 h soak with ping/pong as the executor mode (calctl soak has no executor option yet)",
            # not "M2 met": the milestone is not met until its 24 h are (the tile reads NOT MEASURED)
            key=f"throughput, P99 met; ping/pong soak {pingpong_hours:.2f}/{SOAK_HOURS_M2:g} h",
            evidence=ev,
            files=_files(s, soak if soak is not None and soak.ran else None),
        )
    return _result(spec, Verdict.GO, key, evidence=ev, files=_files(s, soak))


def judge_m3(steps: Steps) -> RowResult:
    spec = M3
    miss = _missing(spec, steps, "batch")
    if miss:
        return miss
    s = steps["batch"]
    doc = s.document
    profiles = doc.get("profiles", [])
    batched = [p for p in profiles if p.get("batch", 1) > 1]
    evidence = tuple(
        f"{p['profile']}: {p['requests']} requests, {p['errors']} errors, fill ratio "
        + ("n/a" if p.get("fill_ratio") is None else f"{p['fill_ratio']:.2f}")
        + ", "
        + ("n/a" if p.get("throughput_tokens_per_s") is None else f"{p['throughput_tokens_per_s']:.0f} tokens/s")
        + ("" if p["batch"] == 1 else (", lanes match B1" if p.get("lanes_match_b1") else ", lanes DIFFER from B1"))
        for p in profiles
    )
    bad = [p["profile"] for p in batched if not p.get("lanes_match_b1") or p.get("errors")]
    key = f"{len(batched)} batched profile(s)" + (f", {', '.join(bad)} wrong" if bad else ", every lane correct")
    if bad or doc.get("verdict") == "FAIL":
        return _result(
            spec,
            Verdict.NO_GO,
            key,
            evidence=evidence,
            files=_files(s),
            reason=f"lanes wrong or requests failed at {', '.join(bad) or 'a profile'}",
        )
    if not batched:
        return not_measured(
            spec,
            "the package compiles only B1: no batched profile to measure",
            "a package with B4/B8/B16 decode profiles, e.g. `calctl sample-package --profiles 1,4,8,16 ...`",
            key=key,
            evidence=evidence,
            files=_files(s),
        )
    return not_measured(
        spec,
        "every lane correct, but the project has set no fill-ratio / throughput / P99 target to judge against and "
        "KV-fault recovery on a batched profile is not exercised (000 §19 M3)",
        "set the project's targets and run a batched KV-fault recovery (not automated by calctl yet)",
        key=key,
        evidence=evidence,
        files=_files(s),
    )


def judge_m4(steps: Steps) -> RowResult:
    key = f"{{cycles}}/{LIFECYCLE_CYCLES} load/unload, {{hours:.2f}}/{SWITCH_HOURS_M4:g} h switching; {{rollback}}"
    return _judge_soak_rows(M4, steps, SWITCH_HOURS_M4, " of switching", key)


JUDGES: dict[str, Callable[[Steps], RowResult]] = {
    "G0": judge_g0,
    "G1": judge_g1,
    "G2": judge_g2,
    "G3": judge_g3,
    "G4": judge_g4,
    "G5": judge_g5,
    "M0": judge_m0,
    "M1": judge_m1,
    "M2": judge_m2,
    "M3": judge_m3,
    "M4": judge_m4,
}


def require_evidence_files(row: RowResult, report_dir: Path) -> RowResult:
    """A GO stays GO only when it names evidence files and every one exists in ``report_dir``."""
    if row.verdict is not Verdict.GO:
        return row
    if not row.files:
        return replace(
            row,
            verdict=Verdict.NOT_MEASURED,
            reason="no evidence file was kept for this row",
            how_to_measure="re-run `calctl accept`; a GO needs its evidence in the report directory",
        )
    missing = [p for p in row.files.values() if not _inside(report_dir, p)]
    if missing:
        return replace(
            row,
            verdict=Verdict.NOT_MEASURED,
            reason=f"evidence file(s) missing from {report_dir}: {', '.join(missing)}",
            how_to_measure="re-run `calctl accept` into a fresh report directory",
        )
    return row


def _inside(report_dir: Path, rel: str) -> bool:
    """``rel`` names a file that exists inside ``report_dir`` (an absolute path or ``..`` leaving it does not)."""
    root = report_dir.resolve()
    target = (report_dir / rel).resolve()
    return target.is_relative_to(root) and target.is_file()


def judge_all(steps: Steps, report_dir: Path) -> tuple[RowResult, ...]:
    """Every row, in order, each judged and then held to its evidence files."""
    return tuple(require_evidence_files(JUDGES[spec.id](steps), report_dir) for spec in ROWS)


__all__ = [
    "JUDGES",
    "ROWS",
    "RowResult",
    "RowSpec",
    "StepEvidence",
    "StepStatus",
    "Verdict",
    "judge_all",
    "not_measured",
    "require_evidence_files",
]
