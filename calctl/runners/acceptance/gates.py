"""The judges of the gates G0–G5 (001 §17), and the soak reading G5 shares with the milestones.

G0 per-chip capacity (budget, load peak), G1 per-chip golden, G2 replica
isolation, G3 S2 concurrency (the combined PoC), G4 the fault domain, G5
production (soak, lifecycle cycles, rollback). Pure: documents in, a
:class:`~calctl.runners.acceptance.rows.RowResult` out; no I/O, nothing run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calctl.runners.acceptance.rows import (
    ACCEPT_LONG,
    G0,
    G1,
    G2,
    G3,
    G4,
    G5,
    ISOLATION_REQUESTS,
    LIFECYCLE_CYCLES,
    SOAK_HOURS_G5,
    Reading,
    RowResult,
    RowSpec,
    StepEvidence,
    Steps,
    estimate,
    gib,
    judge,
    need,
    not_measured,
    not_run,
    step_files,
)


@judge(G0)
def judge_g0(spec: RowSpec, steps: Steps) -> RowResult:
    budget = steps.get("budget")
    if budget is not None and budget.ran and budget.document.get("verdict") == "NO-GO":
        chips = [c for c in budget.document.get("chips", []) if c.get("verdict") != "GO"]
        reasons = "; ".join(f"chip {c['chip']}: {'; '.join(c.get('reasons', []))}" for c in chips)
        return Reading(spec, "static budget NO-GO", files=step_files(budget)).no_go(reasons or "budget NO-GO")
    budget, peak = need(spec, steps, "budget"), need(spec, steps, "load-peak")
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
            f"chip {chip}: static {gib(plan['static_bytes'])}, device memory at load {gib(used)} "
            f"(limit {gib(limit)}, reserve {gib(dram - used)} >= guard {gib(guard)}: {'yes' if fits else 'NO'})"
        )
        if not fits:
            failing.append(chip)
    files = step_files(budget, peak)
    loads = [m for m in peak.document.get("chips", []) if m.get("used_bytes") is not None]
    key = (
        "at load: " + ", ".join(f"chip {m['chip']} {gib(m['used_bytes'])}" for m in loads)
        if loads
        else "no chip measured"
    )
    if per_chip:
        key += f" (limit {gib(min(c['limit_bytes'] for c in per_chip.values()))})"
    read = Reading(spec, key, tuple(evidence), files)
    if failing:
        return read.no_go(f"device memory at load leaves less than the guard on chip {', '.join(map(str, failing))}")
    if unknown or not evidence:
        return Reading(spec, "not measured", tuple(evidence), files).not_measured(
            f"the device reports no per-chip memory for chip {', '.join(map(str, unknown)) or 'any'}",
            "a runtime that answers GetMemoryUsage per chip (docs/calrt-c-abi.md)",
        )
    return read.go()


def _board_chips(steps: Steps) -> int:
    """The board's chip count: from the load (the device's own answer), else the budget, else 2 (001 §2.1)."""
    peak, budget = steps.get("load-peak"), steps.get("budget")
    if peak is not None and peak.ran and peak.document.get("chips"):
        return len(peak.document["chips"])
    if budget is not None and budget.ran and (budget.document.get("device") or {}).get("chips"):
        return int(budget.document["device"]["chips"])
    return 2


@judge(G1)
def judge_g1(spec: RowSpec, steps: Steps) -> RowResult:
    need(spec, steps, "run-golden")
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
    files = step_files(*runs)
    # A chip is exact only when a model ran on it and every model that ran on it matched its golden.
    exact = sum(1 for c, v in passed.items() if v and not failing.get(c))
    read = Reading(spec, f"{exact}/{len(passed)} chips golden exact", evidence, files)
    if failed:
        return read.no_go("; ".join(failed))
    empty = [c for c, v in passed.items() if not v]
    if empty:
        return read.not_measured(
            f"no model of the package(s) runs on chip {', '.join(map(str, empty))}",
            "a package with a model on that chip (the chip-1 build, a combined package, or `--replica PKG`)",
        )
    return read.go()


@judge(G2)
def judge_g2(spec: RowSpec, steps: Steps) -> RowResult:
    """From the ``isolation`` scenario: ``requests.sent``, ``checks`` {name: {pass, fail}}, ``crosstalk`` offenders."""
    s = need(spec, steps, "isolation")
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
    read = Reading(spec, key, evidence, step_files(s))
    if offenders or failing or doc.get("verdict") in ("NO-GO", "FAIL"):
        named = [
            f"{o.get('request_id')} ({o.get('alias')}, chip {o.get('chip')}) {o.get('check')}: {o.get('detail')}"
            if isinstance(o, dict)
            else str(o)
            for o in offenders[:3]
        ]
        return read.no_go("; ".join(named) or f"failing checks: {', '.join(failing)}")
    timed_out = requests.get("timed_out") if isinstance(requests, dict) else None
    if timed_out or doc.get("verdict") == "NOT JUDGED":
        return read.not_measured(
            f"no crosstalk in what was verified, but {timed_out} request(s) timed out: a load outcome of the host "
            "or the device, not isolation evidence either way; fewer than the requests asked for were verified",
            "rerun on a host that is not saturated, or with a longer `--request-timeout`",
        )
    if not isinstance(n, int) or n < ISOLATION_REQUESTS:
        return read.not_measured(
            f"{n} requests checked, the gate needs at least {ISOLATION_REQUESTS} (001 §13.1)",
            "`calctl bench REPLICA --scenario isolation --requests 1000`",
        )
    return read.go()


@judge(G3)
def judge_g3(spec: RowSpec, steps: Steps) -> RowResult:
    s = need(spec, steps, "poc")
    doc = s.document
    verdict = doc.get("verdict")
    busy = doc.get("both_busy_fraction")
    evidence = (
        f"overlap_ratio {estimate(doc.get('overlap_ratio'))}",
        f"throughput_efficiency {estimate(doc.get('throughput_efficiency'))}",
        "both chips computing " + ("n/a" if busy is None else f"{busy:.0%}") + " of the joint wall time",
        *doc.get("reasons", []),
    )
    o = doc.get("overlap_ratio") or {}
    e = doc.get("throughput_efficiency") or {}
    read = Reading(
        spec, f"{verdict}: overlap {estimate(o, '.2f')}, efficiency {estimate(e, '.2f')}", evidence, step_files(s)
    )
    if verdict == "S2":
        return read.go()
    if verdict == "NOT JUDGED":  # the decision rule: an interval still straddles its gate after the budget
        rounds = doc.get("rounds_run") or len(doc.get("rounds") or [])
        return read.not_measured(
            f"not judged after {rounds} rounds: " + ("; ".join(doc.get("reasons", [])) or "an interval straddles"),
            "more PoC rounds (`--level standard` or `long`), on a host that is not saturated",
        )
    if verdict == "S1":
        why = "; ".join(doc.get("reasons", [])) or "the chips did not compute together"
        if (doc.get("device_options") or {}).get("serialize_chips"):
            why = f"--serialize-chips (a modelled global runtime lock): {why}"
        return read.no_go(why)
    return read.no_go(f"the PoC ended {verdict}: {doc.get('error') or 'outputs did not match'}")


@judge(G4)
def judge_g4(spec: RowSpec, steps: Steps) -> RowResult:
    s = need(spec, steps, "fault-isolation")
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
    read = Reading(spec, key, evidence, step_files(s), data)
    if grade == "F0":
        return read.no_go(doc.get("grade_reason", ""))
    if failed_recoveries or not_ready:
        return read.no_go("recovery not deterministic: " + "; ".join(failed_recoveries + not_ready))
    if grade in ("F1", "F2"):
        return read.go()
    if grade == "NOT JUDGED":  # the decision rule: B's device latency undecided in a phase that could lower it
        return read.not_measured(
            f"not judged: {doc.get('grade_reason', '')}",
            "a longer fault-isolation run (`--level standard`) on a host that is not saturated",
        )
    return not_measured(spec, f"the scenario gave no grade ({grade})", spec.measured_by, files=step_files(s))


def soak_reached(doc: Mapping[str, Any]) -> tuple[int, float, int]:
    return int(doc.get("cycles") or 0), float(doc.get("seconds") or 0.0) / 3600.0, len(doc.get("violations", []))


def soak_evidence(doc: Mapping[str, Any]) -> tuple[str, ...]:
    cycles, hours, v = soak_reached(doc)
    drift = (doc.get("memory") or {}).get("max_drift_bytes") or {}
    from calctl.runners.soak.wording import RequestCounts

    req = RequestCounts.of_report(doc.get("requests") or {})
    return (
        f"{cycles} load/unload cycles in {hours:.2f} h, requests {req.phrase()}, {v} violation(s)",
        "max memory drift after unload: "
        + (", ".join(f"chip {c} {'n/a' if b is None else f'{b / 2**20:+.1f} MiB'}" for c, b in drift.items()) or "n/a"),
        *[str(x.get("message")) for x in doc.get("violations", [])[:3]],
    )


def soak_failure(doc: Mapping[str, Any]) -> str | None:
    violations = doc.get("violations", [])
    if violations:
        return "; ".join(str(v.get("message")) for v in violations[:3])
    if doc.get("status") == "aborted":
        return f"the soak aborted: {doc.get('error') or 'see soak-report.json'}"
    return None


def rollback_failure(rb: StepEvidence | None) -> str | None:
    if rb is None or not rb.ran:
        return None
    return None if rb.document.get("ok") else f"rollback failed: {rb.document.get('detail')}"


def judge_soak_rows(spec: RowSpec, steps: Steps, hours_needed: float, what: str, key: str) -> RowResult:
    """G5 and M4 read the soak and the rollback alike: NO-GO on a failure of either (whatever was reached),
    NOT MEASURED while the soak is missing (a ``NotRun``: call it inside a ``judge``), its cycles / hours are
    short of the row's or the rollback to the previous version was not exercised (no ``--previous``: each
    said, with how to measure it), else GO. ``what`` follows the hours in the reason (``""``,
    ``" of switching"``); ``key`` is formatted with ``cycles``, ``hours`` and ``rollback``."""
    soak, rb = steps.get("soak"), steps.get("rollback")
    fails = [f for f in (soak_failure(soak.document) if soak and soak.ran else None, rollback_failure(rb)) if f]
    if fails:
        evidence = soak_evidence(soak.document) if soak and soak.ran else ()
        return Reading(spec, "soak or rollback failed", evidence, step_files(soak, rb)).no_go("; ".join(fails))
    soak = need(spec, steps, "soak")
    rb_miss = not_run(spec, steps, "rollback")
    cycles, hours, _ = soak_reached(soak.document)
    rb_said = (
        f"rollback: {rb.key_figure}" if rb is not None and rb.ran else f"NOT MEASURED: {rb_miss and rb_miss.reason}"
    )
    read = Reading(
        spec,
        key.format(cycles=cycles, hours=hours, rollback="rollback not measured" if rb_miss else "rollback ok"),
        (*soak_evidence(soak.document), rb_said),
        step_files(soak, rb) if rb is not None and rb.ran else step_files(soak),
    )
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
        return read.not_measured("; ".join(reasons), how)
    return read.go()


@judge(G5)
def judge_g5(spec: RowSpec, steps: Steps) -> RowResult:
    key = f"soak {{cycles}}/{LIFECYCLE_CYCLES} cycles, {{hours:.2f}}/{SOAK_HOURS_G5:g} h; {{rollback}}"
    return judge_soak_rows(spec, steps, SOAK_HOURS_G5, "", key)


__all__ = [
    "judge_g0",
    "judge_g1",
    "judge_g2",
    "judge_g3",
    "judge_g4",
    "judge_g5",
    "judge_soak_rows",
    "soak_evidence",
    "soak_failure",
    "soak_reached",
]
