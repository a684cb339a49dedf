"""The judges of the milestones M0–M4 (000 §19): B1 stable, async in-flight = 1, ping/pong, batch, lifecycle.

M0, M2 and M4 read the soak as G5 does (:mod:`~calctl.runners.acceptance.gates`);
M1 and M2 read the executor-modes scenario's milestones, M3 the batch scenario.
Pure: documents in, a :class:`~calctl.runners.acceptance.rows.RowResult` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

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
    read = Reading(spec, key, evidence, step_files(s))
    if bad or doc.get("verdict") == "FAIL":
        return read.no_go(f"lanes wrong or requests failed at {', '.join(bad) or 'a profile'}")
    if not batched:
        return read.not_measured(
            "the package compiles only B1: no batched profile to measure",
            "a package with B4/B8/B16 decode profiles, e.g. `calctl sample-package --profiles 1,4,8,16 ...`",
        )
    return read.not_measured(
        "every lane correct, but the project has set no fill-ratio / throughput / P99 target to judge against and "
        "KV-fault recovery on a batched profile is not exercised (000 §19 M3)",
        "set the project's targets and run a batched KV-fault recovery (not automated by calctl yet)",
    )


@judge(M4)
def judge_m4(spec: RowSpec, steps: Steps) -> RowResult:
    key = f"{{cycles}}/{LIFECYCLE_CYCLES} load/unload, {{hours:.2f}}/{SWITCH_HOURS_M4:g} h switching; {{rollback}}"
    return judge_soak_rows(spec, steps, SWITCH_HOURS_M4, " of switching", key)


__all__ = ["judge_m0", "judge_m1", "judge_m2", "judge_m3", "judge_m4"]
