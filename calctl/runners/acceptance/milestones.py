"""The judges of the milestones M0–M4 (000 §19): B1 stable, async in-flight = 1, ping/pong, batch, lifecycle.

M0, M2 and M4 read the soak as G5 does (:mod:`~calctl.runners.acceptance.gates`);
M1 and M2 read the executor-modes scenario's milestones, M3 the batch scenario.
Pure: documents in, a :class:`~calctl.runners.acceptance.rows.RowResult` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from calctl.checks.stats import MIN_P99_SAMPLES, Estimate, decide
from calctl.runners.acceptance.gates import judge_soak_rows, soak_evidence, soak_failure, soak_reached
from calctl.runners.acceptance.rows import (
    ACCEPT_LONG,
    LIFECYCLE_CYCLES,
    M0,
    M1,
    M2,
    M3,
    M4,
    SOAK_HOURS_M0,
    SOAK_HOURS_M2,
    SWITCH_HOURS_M4,
    Reading,
    RowResult,
    RowSpec,
    Steps,
    estimate,
    judge,
    need,
    not_measured,
    step_files,
)


def _milestone(doc: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    runs = doc.get("runs") or []
    if not runs:
        return None
    m = runs[0].get(name)
    return m if isinstance(m, dict) else None


def _milestone_evidence(m: Mapping[str, Any], clock: str | None = None) -> tuple[str, ...]:
    said = {True: "met", False: "not met", None: "inconclusive"}
    on = f", {clock} clock" if clock else ""
    checks = tuple(
        f"{c['name']}: {estimate(c, '+.3f')} ({c['rule']}{on if c['name'] not in ('errors', 'same_tokens') else ''})"
        f": {said[c['passed']]}"
        for c in m.get("checks", [])
    )
    return checks + tuple(str(n) for n in m.get("notes", []) if str(n).startswith("on the device's clock"))


def _clock(doc: Mapping[str, Any], row: str) -> str | None:
    """Which clock executor-modes judged ``row``'s timings on (``device`` or ``host``; None: not said)."""
    runs = doc.get("runs") or []
    clock = (runs[0].get("workload") or {}).get("clock") if runs and isinstance(runs[0], dict) else None
    return clock.get(row) if isinstance(clock, dict) else None


def _inconclusive(m: Mapping[str, Any]) -> str:
    """Which checks of a milestone were undecided, and why (an interval across the limit, a saturated host)."""
    figures: list[str] = []
    whys: list[str] = []  # a saturated host's sentence is said once, not once per check
    for c in m.get("checks", []):
        if c.get("passed") is None:
            head, sep, why = str(c.get("detail", "")).partition("; inconclusive: ")
            figures.append(head)
            if sep and why not in whys:
                whys.append(why)
    if not figures:
        return "a confidence interval straddles its limit"
    return "; ".join(figures) + (f"; inconclusive: {'; '.join(whys)}" if whys else "")


def _executor_milestone(spec: RowSpec, steps: Steps, how: str) -> RowResult | Reading:
    """M1's or M2's own milestone in the executor-modes scenario: the row when the scenario reported none, or it
    is not met or inconclusive (``how``: what would decide it); when it is met, the reading to go on from."""
    s = need(spec, steps, "executor-modes")
    m = _milestone(s.document, spec.id)
    if m is None:
        return not_measured(spec, f"executor-modes reported no {spec.id}", spec.measured_by, files=step_files(s))
    clock = _clock(s.document, spec.id)
    key = f"{spec.id} {m['verdict']}" + (f" ({clock} clock)" if clock else "")
    read = Reading(spec, key, _milestone_evidence(m, clock), step_files(s))
    if m["verdict"] == "not met":
        failed = [c["name"] for c in m.get("checks", []) if c.get("passed") is False]
        return read.no_go(f"not met: {', '.join(failed)}")
    if m["verdict"] != "met":
        return read.not_measured("inconclusive: " + _inconclusive(m), how)
    return read


@judge(M0)
def judge_m0(spec: RowSpec, steps: Steps) -> RowResult:
    soak = steps.get("soak")
    if soak is not None and soak.ran and (why := soak_failure(soak.document)):
        return Reading(spec, "soak failed", soak_evidence(soak.document), step_files(soak)).no_go(why)
    soak = need(spec, steps, "soak")
    cycles, hours, _ = soak_reached(soak.document)
    profiles = soak.document.get("decode_profiles") or {}
    not_b1 = [a for a, p in profiles.items() if 1 not in p]
    key = f"soak {hours:.2f}/{SOAK_HOURS_M0:g} h, 0 violations"
    if not_b1:
        return Reading(spec, key, files=step_files(soak)).not_measured(
            f"{', '.join(not_b1)} compile no B1 decode profile: M0 is a B1 milestone",
            "a package with a B1 decode graph",
        )
    read = Reading(spec, key, soak_evidence(soak.document), step_files(soak))
    if hours < SOAK_HOURS_M0:
        return read.not_measured(
            f"soak ran {hours:.2f} h/{SOAK_HOURS_M0:g} h ({cycles} cycles, no violation so far)",
            ACCEPT_LONG + " or `calctl soak PKG --hours 24`",
        )
    return read.go()


@judge(M1)
def judge_m1(spec: RowSpec, steps: Steps) -> RowResult:
    # M1's regression is host time by nature (async(1) changes only how the host waits; the chip runs the same
    # jobs one at a time): only a host that is not saturated measures it, and the reason says so (#53 item 3).
    read = _executor_milestone(
        spec,
        steps,
        "`calctl bench PKG --scenario executor-modes` (or `calctl accept PKG --only M1`) on a host whose 1-minute "
        "load average stays below its CPU count during the rounds (stop other work on it, or use a host of its "
        "own); more rounds with `--level standard` narrow an interval that straddles its limit",
    )
    return read.go() if isinstance(read, Reading) else read


@judge(M2)
def judge_m2(spec: RowSpec, steps: Steps) -> RowResult:
    read = _executor_milestone(
        spec,
        steps,
        "more rounds: `calctl accept PKG --level standard --only M2` or `calctl bench PKG --scenario "
        "executor-modes` (its throughput and P99 are judged on the device's clock where the runtime stamps jobs)",
    )
    if not isinstance(read, Reading):
        return read
    soak = steps.get("soak")
    ran = soak if soak is not None and soak.ran else None
    with_soak = replace(read, files={**read.files, **step_files(soak)})
    pingpong_hours = 0.0
    if ran is not None and ran.document.get("executor_mode") == "pingpong":
        if why := soak_failure(ran.document):
            return with_soak.no_go(why)
        pingpong_hours = soak_reached(ran.document)[1]
    if pingpong_hours < SOAK_HOURS_M2:
        # not "M2 met": the milestone is not met until its 24 h are (the tile reads NOT MEASURED)
        key = f"throughput, P99 met; ping/pong soak {pingpong_hours:.2f}/{SOAK_HOURS_M2:g} h"
        return Reading(spec, key, read.evidence, {**read.files, **step_files(ran)}).not_measured(
            f"throughput and P99 met; 24 h without errors under ping/pong not reached "
            f"({pingpong_hours:.2f} h/{SOAK_HOURS_M2:g} h of ping/pong soak)",
            "a 24 h soak with ping/pong as the executor mode (calctl soak has no executor option yet)",
        )
    return with_soak.go()


@judge(M3)
def judge_m3(spec: RowSpec, steps: Steps) -> RowResult:
    s = need(spec, steps, "batch")
    doc = s.document
    profiles = doc.get("profiles", [])
    batched = [p for p in profiles if p.get("batch", 1) > 1]
    kv = doc.get("kv_fault") if isinstance(doc.get("kv_fault"), dict) else None
    evidence = (*(_batch_line(p) for p in profiles), _kv_line(kv))
    bad = [p["profile"] for p in batched if not p.get("lanes_match_b1") or p.get("errors")]
    key = f"{len(batched)} batched profile(s)" + (f", {', '.join(bad)} wrong" if bad else ", every lane correct")
    if bad or (doc.get("verdict") == "FAIL" and not (kv and kv.get("recovered") is False)):
        return Reading(spec, key, evidence, step_files(s)).no_go(
            f"lanes wrong or requests failed at {', '.join(bad) or 'a profile'}"
        )
    if not batched:
        return Reading(spec, key, evidence, step_files(s)).not_measured(
            "the package compiles only B1: no batched profile to measure",
            "a package with B4/B8/B16 decode profiles, e.g. `calctl sample-package --profiles 1,4,8,16 ...`",
        )
    targets = doc.get("project_targets")
    reference: Mapping[str, Any] = next((p for p in profiles if p.get("batch") == 1), {})
    checks = m3_target_checks(batched, reference, targets["M3"]) if targets else []
    data = {"targets": targets, "checks": checks, "kv_fault": kv}
    evidence += tuple(f"{c['figure']}: {c['detail']}" for c in checks)
    kv_said = (
        ""
        if kv is None or not kv.get("measured")
        else "; KV fault " + ("recovered" if kv.get("recovered") else "NOT recovered")
    )
    failed = [c for c in checks if c["passed"] is False]
    undecided = [c for c in checks if c["passed"] is None]
    key += kv_said + (
        "" if not targets else "; targets " + ("NOT met" if failed else "met" if not undecided else "undecided")
    )
    read = Reading(spec, key, evidence, step_files(s), data)
    if kv is not None and kv.get("recovered") is False:
        return read.no_go(f"KV fault at {kv.get('profile')} not recovered: {'; '.join(kv.get('problems') or [])}")
    if failed:
        return read.no_go("; ".join(f"{c['figure']} {c['detail']}" for c in failed))
    kv_how = ""
    if kv is None or not kv.get("measured"):
        kv_why = (kv or {}).get("reason") or "the batch step ran no KV-fault phase"
        kv_how = (kv or {}).get("how_to_measure") or "`calctl bench PKG --scenario batch` on the mock"
    if not targets:
        return read.not_measured(
            "every lane correct"
            + (", KV fault recovered" if not kv_how else f"; KV-fault recovery not measured: {kv_why}")
            + "; but the project has set no fill-ratio / throughput / P99 target to judge against "
            "(000 §19 M3: 达项目目标), and calctl sets none of its own",
            f"{TARGETS_HOW}" + (f"; and the KV fault: {kv_how}" if kv_how else ""),
        )
    if undecided:
        return read.not_measured(
            "; ".join(f"{c['figure']} {c['detail']}" for c in undecided),
            "more requests: `calctl bench PKG --scenario batch` with a package of more lanes, or rerun on a quieter host",
        )
    if kv_how:
        return read.not_measured(f"targets met; KV-fault recovery not measured: {kv_why}", kv_how)
    return read.go()


#: What measures M3 when the project's targets are missing (docs/accept.md "Project targets" has an example file).
TARGETS_HOW = (
    "`calctl accept PKG --targets FILE` with the project's targets (a calctl-accept-targets/v1 file: "
    "fill_ratio_min, throughput_gain_min, p99_itl_regression_max; docs/accept.md 'Project targets' has an example)"
)


def _batch_line(p: Mapping[str, Any]) -> str:
    gain = p.get("gain_vs_b1") or {}
    itl = p.get("itl_p99_s") or {}
    return (
        f"{p['profile']}: {p['requests']} requests, {p['errors']} errors, fill ratio "
        + ("n/a" if p.get("fill_ratio") is None else f"{p['fill_ratio']:.2f}")
        + ", "
        + ("n/a" if p.get("throughput_tokens_per_s") is None else f"{p['throughput_tokens_per_s']:.0f} tokens/s")
        + (f", {gain['gain']:.2f} x B1 ({gain['clock']} clock)" if gain.get("gain") is not None else "")
        + (f", P99 inter-token {itl['mean'] * 1e3:.1f} ms ({itl.get('clock')} clock)" if itl.get("mean") else "")
        + ("" if p["batch"] == 1 else (", lanes match B1" if p.get("lanes_match_b1") else ", lanes DIFFER from B1"))
    )


def _kv_line(kv: Mapping[str, Any] | None) -> str:
    if kv is None:
        return "KV fault: the batch step ran no KV-fault phase"
    return f"KV fault at {kv.get('profile') or 'a batched profile'}: {kv.get('summary')}"


def m3_target_checks(
    batched: list[Mapping[str, Any]], reference: Mapping[str, Any], m3: Mapping[str, float]
) -> list[dict[str, Any]]:
    """Each batched profile's fill ratio, throughput gain over B1 and P99 inter-token regression against the
    project's M3 targets: ``passed`` True / False / None (not decided, ``detail`` says why), naming the target."""
    out: list[dict[str, Any]] = []
    b1 = (reference.get("itl_p99_s") or {}).get("mean")
    for p in batched:
        name = p["profile"]
        fill, gain = p.get("fill_ratio"), (p.get("gain_vs_b1") or {}).get("gain")
        clock = (p.get("gain_vs_b1") or {}).get("clock", "host")
        lo = m3["fill_ratio_min"]
        out.append(
            _check(
                f"{name} fill ratio",
                None if fill is None else fill >= lo,
                "not measured (no decode job)" if fill is None else f"{fill:.2f} (target >= {lo:g}, fill_ratio_min)",
            )
        )
        lo = m3["throughput_gain_min"]
        out.append(
            _check(
                f"{name} throughput gain over B1",
                None if gain is None else gain >= lo,
                "not measured"
                if gain is None
                else f"{gain:.2f} x ({clock} clock; target >= {lo:g}, throughput_gain_min)",
            )
        )
        out.append(_p99_check(name, p.get("itl_p99_s"), b1, m3["p99_itl_regression_max"]))
    return out


def _check(figure: str, passed: bool | None, detail: str) -> dict[str, Any]:
    return {"figure": figure, "passed": passed, "detail": detail}


def _p99_check(name: str, est: Mapping[str, Any] | None, b1: float | None, most: float) -> dict[str, Any]:
    figure = f"{name} P99 inter-token latency"
    if not est or est.get("mean") is None or not b1:
        return _check(figure, None, "not measured: no inter-token gaps at this profile or at B1")
    limit = b1 * (1 + most)
    d = decide(
        Estimate(est["mean"], est.get("ci_low"), est.get("ci_high"), int(est.get("n") or 0)),
        limit,
        above=False,
        min_samples=MIN_P99_SAMPLES,
        what=f"{est['mean'] * 1e3:.1f} ms ({est.get('clock')} clock, {est['mean'] / b1 - 1:+.0%} over B1's "
        f"{b1 * 1e3:.1f} ms; target <= +{most:.0%}, p99_itl_regression_max, i.e. <= {limit * 1e3:.1f} ms):",
        fmt=".4f",
    )
    return _check(figure, d.passed, d.why)


@judge(M4)
def judge_m4(spec: RowSpec, steps: Steps) -> RowResult:
    key = f"{{cycles}}/{LIFECYCLE_CYCLES} load/unload, {{hours:.2f}}/{SWITCH_HOURS_M4:g} h switching; {{rollback}}"
    return judge_soak_rows(spec, steps, SWITCH_HOURS_M4, " of switching", key)


__all__ = ["TARGETS_HOW", "judge_m0", "judge_m1", "judge_m2", "judge_m3", "judge_m4", "m3_target_checks"]
