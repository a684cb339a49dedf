"""The acceptance rows judged from evidence documents (calctl.runners.acceptance: rows, gates, milestones, judges), no device.

Each judge is fed the documents its runners write; the checks are the rules of docs/accept.md: a step that did
not run is NOT MEASURED with its reason, a duration not reached is NOT MEASURED with what was reached unless
what was measured failed, a NO-GO carries the report's action, and a GO without its evidence file present in
the report directory is NOT MEASURED.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calctl.errors import UsageError
from calctl.report import StepStatus
from calctl.runners.acceptance.evidence import error_evidence
from calctl.runners.acceptance.gates import judge_g0, judge_g1, judge_g2, judge_g3, judge_g4, judge_g5
from calctl.runners.acceptance.judges import judge_all, require_evidence_files
from calctl.runners.acceptance.milestones import judge_m0, judge_m1, judge_m2, judge_m3, judge_m4
from calctl.runners.acceptance.rows import RAN, ROWS, GateDecision, StepEvidence, ran_status
from calctl.runtime.errors import CcuException

GIB = 2**30


def ran(name: str, doc: dict[str, Any], files: dict[str, str] | None = None) -> StepEvidence:
    return StepEvidence(
        name, StepStatus.PASS, 1.0, "ran", document=doc, files={"report": f"{name}.json"} if files is None else files
    )


def budget_doc(verdict: str = "GO") -> dict[str, Any]:
    chip = {
        "static_bytes": GIB // 8,
        "limit_bytes": int(12.8 * GIB),
        "guard_bytes": int(2.4 * GIB),
        "dram_bytes": 16 * GIB,
        "verdict": verdict,
        "reasons": ["static 0.125 GiB <= limit 12.8 GiB"] if verdict == "GO" else ["static 14 GiB > limit 12.8 GiB"],
    }
    return {"verdict": verdict, "chips": [{**chip, "chip": 0}, {**chip, "chip": 1}]}


def peak_doc(used: int | None = GIB // 4) -> dict[str, Any]:
    return {"chips": [{"chip": 0, "used_bytes": used}, {"chip": 1, "used_bytes": used}]}


def soak_doc(cycles: int = 3, seconds: float = 10.0, violations: int = 0) -> dict[str, Any]:
    return {
        "status": "finished",
        "cycles": cycles,
        "seconds": seconds,
        "violations": [{"message": f"chip 0 memory drift {i}"} for i in range(violations)],
        "memory": {"max_drift_bytes": {"0": 0, "1": 0}},
        "requests": {"sent": 100},
        "decode_profiles": {"model-a": [1], "model-b": [1]},
    }


def rollback_ok(ok: bool = True) -> StepEvidence:
    return ran("rollback", {"ok": ok, "detail": "reload refused" if not ok else "ok"})


def milestone_doc(m1: str, m2: str) -> dict[str, Any]:
    def check(name: str, passed: bool | None) -> dict[str, Any]:
        return {"name": name, "rule": "<= 3 %", "mean": 0.01, "ci_low": 0.0, "ci_high": 0.02, "passed": passed}

    said = {"met": True, "not met": False, "inconclusive": None}
    return {
        "runs": [
            {
                "M1": {"verdict": m1, "checks": [check("p50_e2e", said[m1])]},
                "M2": {"verdict": m2, "checks": [check("throughput_gain", said[m2])]},
            }
        ]
    }


# -- G0 ---------------------------------------------------------------------------------------------------


def test_g0_go_from_budget_and_load_peak() -> None:
    r = judge_g0({"budget": ran("budget", budget_doc()), "load-peak": ran("load-peak", peak_doc())})
    assert r.verdict is GateDecision.GO
    assert "chip 0" in r.key_figure and set(r.files) == {"budget.report", "load-peak.report"}


def test_g0_no_go_when_the_load_leaves_less_than_the_guard() -> None:
    r = judge_g0({"budget": ran("budget", budget_doc()), "load-peak": ran("load-peak", peak_doc(14 * GIB))})
    assert r.verdict is GateDecision.NO_GO
    assert "guard" in r.reason and "禁止硬塞" in r.action


def test_g0_static_no_go_needs_no_device() -> None:
    r = judge_g0({"budget": ran("budget", budget_doc("NO-GO"))})
    assert r.verdict is GateDecision.NO_GO and "14 GiB" in r.reason


def test_g0_unreported_memory_is_not_measured_never_go() -> None:
    r = judge_g0({"budget": ran("budget", budget_doc()), "load-peak": ran("load-peak", peak_doc(None))})
    assert r.verdict is GateDecision.NOT_MEASURED and "reports no per-chip memory" in r.reason


# -- G1 ---------------------------------------------------------------------------------------------------


def golden(*models: tuple[str, bool, list[int]]) -> StepEvidence:
    return ran(
        "run-golden",
        {"per_model": [{"alias": a, "ok": ok, "reason": None if ok else "token 3", "chips": c} for a, ok, c in models]},
    )


def test_g1_needs_both_chips() -> None:
    assert judge_g1({"run-golden": golden(("a", True, [0]), ("b", True, [1]))}).verdict is GateDecision.GO
    one = judge_g1({"run-golden": golden(("a", True, [0]))})
    assert one.verdict is GateDecision.NOT_MEASURED and "chip 1" in one.reason and "--replica" in one.how_to_measure


def test_g1_a_mismatch_on_one_chip_is_no_go() -> None:
    r = judge_g1({"run-golden": golden(("a", True, [0]), ("b", False, [1]))})
    assert (
        r.verdict is GateDecision.NO_GO and "b" in r.reason and "chip 1" in r.reason and "compiler/kernel" in r.action
    )


# -- G2 ---------------------------------------------------------------------------------------------------


def test_g2_without_a_replica_says_how_to_make_one() -> None:
    steps = {
        "isolation": StepEvidence(
            "isolation",
            StepStatus.SKIP,
            detail="G2 needs a replica package",
            document={"how_to_measure": "`calctl sample-package --kind replica --key K OUT`"},
        )
    }
    r = judge_g2(steps)
    assert r.verdict is GateDecision.NOT_MEASURED and "sample-package --kind replica" in r.how_to_measure


def test_g2_crosstalk_is_no_go_naming_the_request() -> None:
    doc = {
        "verdict": "NO-GO",
        "requests": {"sent": 1000, "completed": 900, "cancelled": 100, "failed": 0},
        "checks": {"output_matches_reference": {"pass": 999, "fail": 1}},
        "crosstalk": [{"request_id": "iso-17", "alias": "a1", "chip": 1, "check": "kv", "detail": "KV of A0"}],
    }
    r = judge_g2({"isolation": ran("isolation", doc)})
    assert r.verdict is GateDecision.NO_GO and "iso-17" in r.reason and "不进入不同模型阶段" in r.action


def test_g2_fewer_than_1000_requests_is_not_measured() -> None:
    few = {"verdict": "GO", "requests": {"sent": 200}, "checks": {"output": {"pass": 200, "fail": 0}}, "crosstalk": []}
    r = judge_g2({"isolation": ran("isolation", few)})
    assert r.verdict is GateDecision.NOT_MEASURED and "200" in r.reason
    ok = judge_g2({"isolation": ran("isolation", {**few, "requests": {"sent": 1000}})})
    assert ok.verdict is GateDecision.GO


def test_g2_timeouts_are_a_load_outcome_not_measured_never_crosstalk() -> None:
    """Issue 26: requests that only timed out (zero wrong outputs) are no NO-GO and no GO: NOT MEASURED."""
    doc = {
        "verdict": "NOT JUDGED",
        "requests": {"sent": 1000, "completed": 540, "cancelled": 7, "failed": 0, "timed_out": 453},
        "checks": {"completed_equals_reference": {"pass": 540, "fail": 0}, "served": {"pass": 547, "fail": 0}},
        "crosstalk": [],
    }
    r = judge_g2({"isolation": ran("isolation", doc)})
    assert r.verdict is GateDecision.NOT_MEASURED and "453 request(s) timed out" in r.reason and "load" in r.reason
    assert "request-timeout" in r.how_to_measure and any("453 timed out" in e for e in r.evidence)


# -- G3 ---------------------------------------------------------------------------------------------------


def poc(verdict: str, serialize: bool = False) -> StepEvidence:
    est = {"mean": 0.5, "ci_low": 0.48, "ci_high": 0.52}
    return ran(
        "poc",
        {
            "verdict": verdict,
            "overlap_ratio": est,
            "throughput_efficiency": {"mean": 0.99, "ci_low": 0.97, "ci_high": 1.0},
            "both_busy_fraction": 0.9 if verdict == "S2" else 0.0,
            "reasons": ["per-chip trace: both chips computing during 0% of the joint wall time"],
            "device_options": {"serialize_chips": serialize},
        },
    )


def test_g3_s2_is_go_with_the_ci() -> None:
    r = judge_g3({"poc": poc("S2")})
    assert r.verdict is GateDecision.GO and "[0.48, 0.52]" in r.key_figure


def test_g3_s1_is_no_go_with_the_reports_action() -> None:
    r = judge_g3({"poc": poc("S1", serialize=True)})
    assert r.verdict is GateDecision.NO_GO
    assert r.action.startswith("declare S1 only, investigate the global runtime lock / shared bottleneck")
    assert "--serialize-chips" in r.reason


def test_g3_not_judged_is_not_measured_with_the_interval() -> None:
    doc = poc("NOT JUDGED")
    doc.document["reasons"] = ["overlap_ratio CI [-0.160, 0.460] straddles 0.000 (n=16): more samples would decide it"]
    doc.document["rounds_run"] = 16
    r = judge_g3({"poc": doc})
    assert r.verdict is GateDecision.NOT_MEASURED and "after 16 rounds" in r.reason and "straddles" in r.reason


# -- G4 ---------------------------------------------------------------------------------------------------


def fi(grade: str, recovery_ok: bool = True) -> StepEvidence:
    phase = {
        "phase": "ccu-exception",
        "class": "runtime",
        "scope_granted": "board reset",
        "b_succeeded": 3,
        "b_requests": 10,
        "b_impacted": True,
        "recoveries": [{"scope": "board", "reason": "fault", "alias": "model-a", "ok": recovery_ok}],
        "note": "",
    }
    return ran("fault-isolation", {"grade": grade, "grade_reason": f"{grade} because", "phases": [phase]})


def test_g4_f1_with_a_clean_recovery_is_go_and_f0_is_no_go() -> None:
    assert judge_g4({"fault-isolation": fi("F1")}).verdict is GateDecision.GO
    assert judge_g4({"fault-isolation": fi("F2")}).verdict is GateDecision.GO
    f0 = judge_g4({"fault-isolation": fi("F0")})
    assert f0.verdict is GateDecision.NO_GO and "同时摘流" in f0.action


def test_g4_an_undecided_grade_is_not_measured() -> None:
    r = judge_g4({"fault-isolation": fi("NOT JUDGED")})
    assert r.verdict is GateDecision.NOT_MEASURED and r.reason.startswith("not judged: NOT JUDGED because")


def test_g4_a_failed_recovery_is_no_go_even_at_f1() -> None:
    r = judge_g4({"fault-isolation": fi("F1", recovery_ok=False)})
    assert r.verdict is GateDecision.NO_GO and "recovery not deterministic" in r.reason and r.data["grade"] == "F1"


def test_g4_on_a_board_without_fault_injection_is_not_measured() -> None:
    r = judge_g4(
        {
            "fault-isolation": StepEvidence(
                "fault-isolation", StepStatus.SKIP, detail="fault-isolation arms faults with the mock board's"
            )
        }
    )
    assert r.verdict is GateDecision.NOT_MEASURED and "mock" in r.reason


# -- G5, M0, M4: durations ----------------------------------------------------------------------------------


def test_durations_not_reached_are_not_measured_with_what_was_reached() -> None:
    steps = {"soak": ran("soak", soak_doc(3, 1440.0)), "rollback": rollback_ok()}
    g5, m0, m4 = judge_g5(steps), judge_m0(steps), judge_m4(steps)
    assert g5.verdict is m0.verdict is m4.verdict is GateDecision.NOT_MEASURED
    assert "3/100 cycles" in g5.reason and "0.40 h/24 h" in g5.reason and "--level long" in g5.how_to_measure
    assert "0.40 h/24 h" in m0.reason
    assert "0.40 h/8 h" in m4.reason


def test_durations_reached_are_go() -> None:
    steps = {"soak": ran("soak", soak_doc(120, 24 * 3600.0)), "rollback": rollback_ok()}
    assert judge_g5(steps).verdict is GateDecision.GO
    assert judge_m0(steps).verdict is GateDecision.GO
    assert judge_m4(steps).verdict is GateDecision.GO


def test_a_failure_before_the_duration_is_no_go() -> None:
    steps = {"soak": ran("soak", soak_doc(2, 60.0, violations=1)), "rollback": rollback_ok()}
    for judge in (judge_g5, judge_m0, judge_m4):
        r = judge(steps)
        assert r.verdict is GateDecision.NO_GO and "memory drift" in r.reason and r.action
    rb = judge_g5({"soak": ran("soak", soak_doc(120, 24 * 3600.0)), "rollback": rollback_ok(False)})
    assert rb.verdict is GateDecision.NO_GO and "rollback failed" in rb.reason and "两板" in rb.action


def test_without_a_previous_version_the_rollback_part_is_not_measured_even_at_the_long_durations() -> None:
    """Issue 29 item 7: reloading PKG onto itself exercises no version change. With no ``--previous`` the
    rollback step is SKIPPED, and G5 / M4 are NOT MEASURED saying so and how to measure it, never GO at the
    report's durations; short durations and a missing rollback are both said."""
    how = "`calctl accept PKG --previous OLD_PKG` (OLD_PKG: the version PKG replaces)"
    skipped = StepEvidence(
        "rollback",
        StepStatus.SKIP,
        detail="no --previous package given: the one-call rollback to the old version was not exercised",
        document={"how_to_measure": how},
    )
    long_soak = {"soak": ran("soak", soak_doc(120, 24 * 3600.0)), "rollback": skipped}
    for judge in (judge_g5, judge_m4):
        r = judge(long_soak)
        assert r.verdict is GateDecision.NOT_MEASURED, r
        assert "rollback not run: no --previous package given" in r.reason and "cycles" not in r.reason
        assert r.how_to_measure == how and r.key_figure.endswith("rollback not measured")
        assert "rollback.report" not in r.files and r.files  # the soak's evidence, none claimed for the rollback
    short = judge_g5({"soak": ran("soak", soak_doc(3, 1440.0)), "rollback": skipped})
    assert "3/100 cycles" in short.reason and "no --previous package given" in short.reason
    assert short.how_to_measure.startswith("`calctl accept PKG --level long --previous OLD_PKG`")
    with_it = judge_m4({"soak": ran("soak", soak_doc(120, 24 * 3600.0)), "rollback": rollback_ok()})
    assert with_it.verdict is GateDecision.GO and with_it.key_figure.endswith("rollback ok")


def test_m0_needs_a_b1_package() -> None:
    doc = {**soak_doc(120, 24 * 3600.0), "decode_profiles": {"model-a": [4, 8]}}
    r = judge_m0({"soak": ran("soak", doc)})
    assert r.verdict is GateDecision.NOT_MEASURED and "B1" in r.reason


# -- M1, M2, M3 ----------------------------------------------------------------------------------------------


def test_m1_m2_from_executor_modes() -> None:
    steps = {"executor-modes": ran("executor-modes", milestone_doc("met", "met")), "soak": ran("soak", soak_doc())}
    assert judge_m1(steps).verdict is GateDecision.GO
    m2 = judge_m2(steps)  # throughput and P99 met, but no 24 h of ping/pong
    assert m2.verdict is GateDecision.NOT_MEASURED and "24 h" in m2.reason
    bad = {"executor-modes": ran("executor-modes", milestone_doc("not met", "not met"))}
    assert judge_m1(bad).verdict is GateDecision.NO_GO
    m2_bad = judge_m2(bad)
    assert m2_bad.verdict is GateDecision.NO_GO and "ping/pong is not enabled by default" in m2_bad.action
    unsure = judge_m1({"executor-modes": ran("executor-modes", milestone_doc("inconclusive", "met"))})
    assert unsure.verdict is GateDecision.NOT_MEASURED and "inconclusive" in unsure.reason


def batch(profiles: list[dict[str, Any]], verdict: str = "PASS") -> StepEvidence:
    return ran("batch", {"verdict": verdict, "profiles": profiles})


def profile(b: int, match: bool = True) -> dict[str, Any]:
    return {
        "profile": f"B{b}",
        "batch": b,
        "requests": 64,
        "errors": 0,
        "fill_ratio": 1.0,
        "throughput_tokens_per_s": 100.0 * b,
        "lanes_match_b1": match,
    }


def test_m3() -> None:
    only_b1 = judge_m3({"batch": batch([profile(1)])})
    assert only_b1.verdict is GateDecision.NOT_MEASURED and "only B1" in only_b1.reason
    wrong = judge_m3({"batch": batch([profile(1), profile(4, match=False)], "FAIL")})
    assert wrong.verdict is GateDecision.NO_GO and "continuous batching" in wrong.action and "B4" in wrong.reason
    right = judge_m3({"batch": batch([profile(1), profile(4)])})
    assert right.verdict is GateDecision.NOT_MEASURED and "target" in right.reason  # no targets set: never a GO claim


# -- every row --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [None, StepStatus.INTERRUPTED, StepStatus.ERROR, StepStatus.SKIP])
def test_no_step_no_verdict(tmp_path: Path, status: StepStatus | None) -> None:
    """A step that did not run (None: not reached yet, a checkpoint) leaves its rows NOT MEASURED, saying why."""
    names = {n for spec in ROWS for n in spec.steps}
    steps = (
        {}
        if status is None
        else {n: StepEvidence(n, status, detail=f"{status.value.lower()} for the test") for n in names}
    )
    rows = judge_all(steps, tmp_path)
    assert [r.id for r in rows] == ["G0", "G1", "G2", "G3", "G4", "G5", "M0", "M1", "M2", "M3", "M4"]
    for r in rows:
        assert r.verdict is GateDecision.NOT_MEASURED, r
        assert r.reason and r.how_to_measure, r


def test_a_go_whose_evidence_file_is_missing_is_not_measured(tmp_path: Path) -> None:
    steps = {"poc": ran("poc", poc("S2").document, {"trace": "poc.trace.json", "plot": "poc.png"})}
    row = judge_g3(steps)
    assert row.verdict is GateDecision.GO
    (tmp_path / "poc.trace.json").write_text("{}")
    held = require_evidence_files(row, tmp_path)
    assert held.verdict is GateDecision.NOT_MEASURED and "poc.png" in held.reason
    (tmp_path / "poc.png").write_bytes(b"png")
    assert require_evidence_files(row, tmp_path).verdict is GateDecision.GO
    bare = require_evidence_files(judge_g3({"poc": ran("poc", poc("S2").document, {})}), tmp_path)
    assert bare.verdict is GateDecision.NOT_MEASURED and "no evidence file" in bare.reason


def test_a_no_go_keeps_its_verdict_without_files(tmp_path: Path) -> None:
    row = judge_g3({"poc": ran("poc", poc("S1").document, {"trace": "gone.json"})})
    assert require_evidence_files(row, tmp_path).verdict is GateDecision.NO_GO


def test_evidence_paths_cannot_point_outside_by_absolute_path(tmp_path: Path) -> None:
    """A row file is looked up in the report directory; an absolute path outside it does not make a GO."""
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"x")
    report = tmp_path / "report"
    report.mkdir()
    row = judge_g3({"poc": ran("poc", poc("S2").document, {"plot": str(outside)})})
    assert require_evidence_files(row, report).verdict is GateDecision.NOT_MEASURED


# -- issue 29: every line of the report true -------------------------------------------------------------


def test_g1_key_figure_counts_a_chip_exact_only_when_every_model_on_it_passes() -> None:
    """Item 4: model-a exact on chip 0, model-b exact on chip 1, but the replica's A1 on chip 1 mismatches: the
    verdict is NO-GO and the key figure must not say both chips are exact."""
    replica = StepEvidence(
        "replica-golden",
        StepStatus.FAIL,  # it ran; a model failed its golden
        document={"per_model": [{"alias": "a1", "ok": False, "reason": "token 3", "chips": [1]}]},
        files={"report": "replica/run-golden.json"},
    )
    r = judge_g1({"run-golden": golden(("a", True, [0]), ("b", True, [1])), "replica-golden": replica})
    assert r.verdict is GateDecision.NO_GO
    assert r.key_figure == "1/2 chips golden exact", r.key_figure
    assert any("chip 1" in e and "MISMATCH" in e for e in r.evidence), r.evidence


def test_m2_key_figure_does_not_read_met_when_the_row_is_not_measured() -> None:
    """Item 8: throughput and P99 met but no 24 h ping/pong soak: the tile reads NOT MEASURED, so its key
    figure must not say "M2 met"."""
    r = judge_m2({"executor-modes": ran("executor-modes", milestone_doc("met", "met"))})
    assert r.verdict is GateDecision.NOT_MEASURED
    assert "M2 met" not in r.key_figure and "0.00/24 h" in r.key_figure, r.key_figure


def test_m2_reads_a_ping_pong_soak_its_24_h_or_its_failure() -> None:
    """M2's third condition: 24 h without errors under ping/pong (000 §19 M2); a default-mode soak does not count."""
    modes = ran("executor-modes", milestone_doc("met", "met"), {"report": "executor-modes/bench-report.json"})

    def soak(violations: int, mode: str = "pingpong") -> StepEvidence:
        doc = {**soak_doc(cycles=200, seconds=25 * 3600.0, violations=violations), "executor_mode": mode}
        return ran("soak", doc, {"report": "soak/soak-report.json"})

    go = judge_m2({"executor-modes": modes, "soak": soak(0)})
    assert go.verdict is GateDecision.GO and go.key_figure == "M2 met", go
    assert set(go.files) == {"executor-modes.report", "soak.report"}
    no_go = judge_m2({"executor-modes": modes, "soak": soak(2)})
    assert no_go.verdict is GateDecision.NO_GO and "memory drift" in no_go.reason and no_go.action, no_go
    default_mode = judge_m2({"executor-modes": modes, "soak": soak(0, mode="default")})
    assert default_mode.verdict is GateDecision.NOT_MEASURED and "0.00/24 h" in default_mode.key_figure
    assert set(default_mode.files) == {"executor-modes.report", "soak.report"}


def test_a_step_that_raised_is_error_with_its_words_code() -> None:
    ev = error_evidence("soak", CcuException("chip 0 halted"), 0.1)
    assert ev.status is StepStatus.ERROR and ev.document["exit_code"] == 3 and "chip 0 halted" in ev.detail
    bug = error_evidence("soak", KeyError("lanes"), 0.1)
    assert bug.document == {"exit_code": 70, "internal_error": True}
    # mid-run, a file the step reads turned bad: ERROR naming it, so the other rows' evidence is kept
    bad = error_evidence("rollback", UsageError("plan.yaml: malformed YAML at line 3"), 0.1)
    assert bad.status is StepStatus.ERROR and bad.document["exit_code"] == 3 and "plan.yaml" in bad.detail


def test_an_evidence_step_speaks_the_step_words_of_every_report() -> None:
    """accept's steps carry calctl.report's step words (no RAN/SKIPPED/PENDING of their own), the why in detail:
    a step that ran is PASS, WARN or FAIL by its own verdict, and only those carry evidence."""
    words = {v: ran_status(v) for v in ("PASS", "WARN", "GO", "S1", "S2", "MEASURED", "NOT JUDGED", "F1")}
    assert set(words.values()) == {StepStatus.PASS, StepStatus.WARN} and words["WARN"] is StepStatus.WARN
    assert {ran_status(v) for v in ("FAIL", "NO-GO", "F0")} == {StepStatus.FAIL}
    assert ran_status("ERROR") is StepStatus.ERROR and ran_status("TIMEOUT") is StepStatus.ERROR
    assert {StepStatus.PASS, StepStatus.WARN, StepStatus.FAIL} == RAN
    skipped = StepEvidence("rollback", StepStatus.SKIP, detail="no --previous package given").to_dict()
    assert skipped == {
        "name": "rollback",
        "status": "SKIP",
        "seconds": 0.0,
        "detail": "no --previous package given",
        "key_figure": "",
        "files": {},
    }
    assert not StepEvidence("x", StepStatus.SKIP).ran and StepEvidence("x", StepStatus.FAIL).ran
