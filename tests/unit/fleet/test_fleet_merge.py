"""The fleet report: report directories merged into one table of boards x steps (calctl.fleet.merge)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calctl.fleet import FleetReport, InfraError, merge_reports
from calctl.fleet.merge import severity, worst
from calctl.package import schemas

DIGEST = "ab" * 32


def _run(root: Path, board: str, verdict: str, steps: dict[str, str], **extra: Any) -> Path:
    d = root / board
    d.mkdir(parents=True)
    doc = {
        "schema_version": "1",
        "command": "bringup",
        "device": "mock",
        "device_label": "mock",
        "device_options": {"kind": "mock", "seed": None, "fault_plan": None},
        "package": {"name": "pkg", "version": "1.0.0", "digest": DIGEST},
        "verdict": verdict,
        "exit_code": 0,
        "error": None,
        "seconds": 1.5,
        "summary": [{"step": s, "verdict": v} for s, v in steps.items()],
        **extra,
    }
    (d / "report.json").write_text(json.dumps(doc))
    (d / "report.html").write_text("<html></html>")
    (d / "board.json").write_text(json.dumps({"id": board, "kind": "mock", "seed": len(board)}))
    return d


def _valid(report: FleetReport) -> dict[str, Any]:
    doc = json.loads(report.json_path.read_text())
    assert list(schemas.iter_errors("calctl-fleet-report/v1", doc)) == []
    return doc


def test_rows_per_board_worst_verdict_failing_first_and_relative_links(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    a = _run(runs, "b0", "PASS", {"validate": "PASS", "soak": "PASS"})
    b = _run(runs, "b1", "FAIL", {"validate": "PASS", "soak": "FAIL"})
    c = _run(runs, "b2", "WARN", {"validate": "WARN", "soak": "PASS"})
    report = merge_reports([a, b, c], runs)
    assert report.verdict == "FAIL" and report.exit_code == 1
    doc = _valid(report)
    assert doc["command"] == "report merge" and doc["board_command"] == "bringup"
    assert not list(schemas.iter_errors("report/v1", doc))  # a fleet report is a report, as every --format json
    assert [r["board_id"] for r in doc["boards"]] == ["b1", "b2", "b0"]  # failing first, then the warning
    assert doc["step_names"] == ["validate", "soak"]
    failing = doc["boards"][0]
    assert failing["steps"] == {"validate": "PASS", "soak": "FAIL"} and failing["reason"] == "soak FAIL"
    assert failing["report_dir"] == "b1" and failing["page"] == "b1/report.html"
    assert failing["package_digest"] == DIGEST and failing["seed"] == 2 and failing["infrastructure"] is False
    assert "MOCK RESULT for b0, b1, b2" in doc["note"]
    page = report.html_path.read_text()
    assert page.index('data-board="b1"') < page.index('data-board="b0"')
    assert 'href="./b1/"' in page and ">FAIL<" in page


def test_an_infrastructure_error_is_an_error_row_naming_the_place_never_a_fail(tmp_path: Path) -> None:
    a = _run(tmp_path / "runs", "b0", "PASS", {"validate": "PASS"})
    report = merge_reports([a], tmp_path / "fleet", infra_errors=[InfraError("rack1-b3", "host-7", "exporter offline")])
    doc = _valid(report)
    assert report.verdict == "ERROR" and report.exit_code == 3
    row = doc["boards"][0]
    assert row["board_id"] == "rack1-b3" and row["verdict"] == "ERROR" and row["infrastructure"] is True
    assert row["place"] == "host-7" and "host-7" in row["reason"] and "exporter offline" in row["reason"]
    assert doc["boards"][1]["report_dir"] == "../runs/b0"


def test_a_directory_without_a_report_is_an_infrastructure_error_row(tmp_path: Path) -> None:
    a = _run(tmp_path, "b0", "PASS", {"validate": "PASS"})
    dead = tmp_path / "b1"
    dead.mkdir()
    (dead / "board.json").write_text(json.dumps({"id": "b1", "kind": "mock", "seed": 7}))
    bad = tmp_path / "b2"
    bad.mkdir()
    (bad / "report.json").write_text("[" * 100 + "]" * 100)  # nested past the bounded reader's limit
    report = merge_reports([a, dead, bad], tmp_path)
    doc = _valid(report)
    rows = {r["board_id"]: r for r in doc["boards"]}
    assert rows["b1"]["infrastructure"] and "no report.json" in rows["b1"]["reason"] and rows["b1"]["seed"] == 7
    assert rows["b2"]["infrastructure"] and "nested" in rows["b2"]["reason"]
    assert rows["b0"]["verdict"] == "PASS" and report.verdict == "ERROR"


@pytest.mark.parametrize("word", ["RUNNING", "SKIP"])
def test_a_checkpoint_or_a_step_word_as_a_runs_verdict_is_a_run_that_did_not_end(tmp_path: Path, word: str) -> None:
    """A soak or accept checkpoint (RUNNING) left by a run that died has no exit code: an infrastructure ERROR row
    naming the file, never a calctl internal error."""
    a = _run(tmp_path, "b0", word, {"soak": word})
    report = merge_reports([a], tmp_path)
    row = _valid(report)["boards"][0]
    assert report.verdict == "ERROR" and row["infrastructure"] and "not a run's final verdict" in row["reason"]


def test_an_interrupted_fan_out_says_so(tmp_path: Path) -> None:
    a = _run(tmp_path, "b0", "INTERRUPTED", {"validate": "PASS", "soak": "INTERRUPTED"}, error="SIGINT in soak")
    report = merge_reports([a], tmp_path, interrupted="SIGINT")
    doc = _valid(report)
    assert doc["verdict"] == "INTERRUPTED" and doc["exit_code"] == 130 and "SIGINT" in doc["reasons"][0]


def test_worst_follows_the_verdict_table() -> None:
    assert worst(["PASS", "WARN", "GO"]) == "WARN"
    assert worst(["PASS", "NOT JUDGED", "FAIL"]) == "FAIL"
    assert worst(["FAIL", "ERROR"]) == "ERROR"
    assert worst(["ERROR", "INTERRUPTED", "FAIL"]) == "INTERRUPTED"
    assert severity("PASS") == severity("GO") == 0 < severity("MEASURED") < severity("WARN") < severity("NO-GO")
    assert worst([]) == "PASS" and worst(["GO", "GO"]) == "GO" and worst(["GO", "WARN"]) == "WARN"


def test_nothing_to_merge_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no report directory"):
        merge_reports([], tmp_path)
