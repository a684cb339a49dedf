"""The vendor questions are a table of rows (question, report section, the checks each needs, its grading function),
and a row about timing is never graded C0 from the shim's own time stamps alone (issue 50 item 1)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from calctl.runtime.conformance import CHECK_NAMES, CheckResult, Verdict, vendor_questions
from calctl.runtime.conformance.vendor import ROWS

#: what a healthy board's checks leave as evidence for the timing rows (figures as the reference board measures)
_EVIDENCE: dict[str, dict[str, Any]] = {
    "concurrent_submit_two_chips": {"overlap_ms": 120.0, "host_speedup": 1.8, "inside_at_once": 4, "jobs": 128},
    "two_in_flight_one_chip": {"max_in_flight": 2, "host_speedup": 1.5},
    "memory_counters": {"load_cycles": 6, "counters_reported": True, "memory": []},
    "versions_topology": {"device_kind": "software model"},
}


def _results(**evidence: dict[str, Any]) -> list[CheckResult]:
    return [
        CheckResult(
            name,
            name,
            Verdict.PASS,
            0.1,
            f"{name} held",
            evidence={**_EVIDENCE.get(name, {}), **evidence.get(name, {})},
        )
        for name in CHECK_NAMES
    ]


def _row(answers: list[Any], source: str) -> Any:
    return next(a for a in answers if a.source.split(",")[0] == source)


def test_every_item_of_both_reports_is_one_row_naming_checks_that_exist() -> None:
    sources = [row.source for row in ROWS]
    assert len(sources) == len(set(sources))
    for i in range(1, 7):
        assert any(s.startswith(f"000 §20 item {i}") for s in sources), i
    for i in range(1, 11):
        assert any(f"001 §15.2 item {i}" in s for s in sources), i
    for row in ROWS:
        assert set(row.needs) <= set(CHECK_NAMES), (row.source, row.needs)
        assert {check for check, _ in row.host} <= set(CHECK_NAMES), (row.source, row.host)
        assert row.needs == () or row.symbol, row.source  # a C1 row names the call that is present


def test_a_healthy_board_grades_the_timing_rows_c0_with_both_figures() -> None:
    answers = vendor_questions(_results())
    for source in ("000 §20 item 3", "001 §15.2 item 2"):
        row = _row(answers, source)
        assert row.grade == "C0" and "the host saw" in row.answer, row


@pytest.mark.parametrize("row", [r for r in ROWS if r.host], ids=lambda r: r.source)
def test_a_timing_row_without_its_host_figure_is_never_c0(row: Any) -> None:
    for check, key in row.host:
        results = [
            dataclasses.replace(r, evidence={k: v for k, v in r.evidence.items() if k != key}) if r.name == check else r
            for r in _results()
        ]
        answer = _row(vendor_questions(results), row.source.split(",")[0])
        assert answer.grade != "C0" and "not confirmed" in answer.answer, (check, key, answer)


@pytest.mark.parametrize("speedup", [0.9, 1.05])
def test_stamps_that_overlap_while_the_host_saw_no_gain_disagree(speedup: float) -> None:
    """A global lock that stamps start_ns before taking it: the stamps overlap, the host's bursts do not."""
    answers = vendor_questions(_results(concurrent_submit_two_chips={"host_speedup": speedup}))
    for source in ("000 §20 item 3", "001 §15.2 item 2"):
        row = _row(answers, source)
        assert row.grade == "C1" and "disagree" in row.answer, row


def test_a_check_that_did_not_pass_leaves_its_rows_c1_naming_the_call() -> None:
    results = [
        dataclasses.replace(r, verdict=Verdict.FAIL) if r.name == "blocked_wait_holds_no_lock" else r
        for r in _results()
    ]
    row = _row(vendor_questions(results), "001 §15.2 item 4")
    assert row.grade == "C1" and row.evidence == (
        "calrt_job_submit/calrt_job_wait present; check blocked_wait_holds_no_lock FAIL"
    ), row
