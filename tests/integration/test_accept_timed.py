"""``calctl accept`` on the mock, the timed rows (docs/accept.md): G3 and G4 at the quick level under a fault plan
whose CCU fault takes the whole board (judged on the device's own job intervals, so at any host load), and the
runs cut short or refused: ``--serialize-chips`` makes G3 NO-GO with the report's action, a KV-corruption plan
makes G2 NO-GO, an interrupted run leaves a partial report, and bad options exit 2. Each of those measures one
row with ``--only`` so it stays short. (The untimed rows: test_accept.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, assert_no_traceback
from tests.integration.accept_harness import (
    COMBINED,
    REPLICA,
    TIMED_ROWS,
    TRUST,
    assert_no_traceback_text,
    assert_rows_shape,
    quick_level,
    rows_by_id,
    run_accept,
)
from tests.integration.reference_board import _clean_reference_env  # noqa: F401  (autouse: no CALRT_* leaks in)
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # the quick level's timed rows: one run, its fault-isolation scenario included

# This board's CCU faults take the whole board (reset_scope: board; probability 0, so it is the fault-isolation
# scenario's own ccu-exception phase that fires one); its wait-timeouts keep the default chip scope.
BOARD_WIDE_CCU = (
    "schema: calctl-fault-plan/v1\nfaults:\n  - kind: ccu_exception\n    probability: 0\n    reset_scope: board\n"
)


@pytest.fixture(scope="module")
def quick_timed(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path, str]:
    tmp = tmp_path_factory.mktemp("accept-quick-timed")
    plan = tmp / "ccu-board.yaml"
    plan.write_text(BOARD_WIDE_CCU, encoding="utf-8")
    return quick_level(tmp / "report", ",".join(TIMED_ROWS), "--fault-plan", plan)


def test_quick_level_timed_rows_and_a_board_wide_ccu_fault(quick_timed) -> None:
    """001 §13.4: F1 is "request and resource faults isolated, but CCU/timeout/reset share the fault domain".

    The fault plan says this board's CCU faults take the whole board. The grade is what the fault-isolation
    scenario measures, and G4 follows the report's rule: Go iff >= F1 and every recovery succeeded with both
    models Ready again, NO-GO "recovery not deterministic" otherwise."""
    code, doc, out, _ = quick_timed
    rows = assert_rows_shape(doc, out, TIMED_ROWS)
    assert rows["G3"]["verdict"] == "GO", rows["G3"]
    assert (out / "poc.trace.json").is_file()
    report = json.loads((out / "fault-isolation" / "bench-report.json").read_text())
    ccu = next(p for p in report["phases"] if p["phase"] == "ccu-exception")
    assert "board" in ccu["scope_granted"] and ccu["b_impacted"] is True, ccu  # the fault took the whole board
    g4 = rows["G4"]
    assert report["grade"] == "F1" and g4["data"]["grade"] == "F1", report["grade_reason"]
    failed = [r for p in report["phases"] for r in p["recoveries"] if not r["ok"]]
    not_ready = [p["note"] for p in report["phases"] if p["note"]]
    if failed or not_ready:
        assert g4["verdict"] == "NO-GO" and "recovery not deterministic" in g4["reason"], g4
        assert code == 1
    else:
        assert g4["verdict"] == "GO", g4
        assert code == 0


def test_quick_level_fault_isolation_grades_f1_phase_by_phase(quick_timed) -> None:
    """The quick level's fault-isolation run (docs/bench.md §5), phase by phase: its evidence behind G4."""
    _, _, out, _ = quick_timed
    doc = json.loads((out / "fault-isolation" / "bench-report.json").read_text())
    assert doc["mock_result"] is True and "MOCK RESULT" in doc["note"]
    rows = {p["phase"]: p for p in doc["phases"]}
    assert list(rows) == [
        "baseline",
        "invalid-tensor",
        "kv-exhausted",
        "submit-busy",
        "wait-timeout",
        "ccu-exception",
        "drain-deadline",
        "unload-reload",
    ]
    assert rows["invalid-tensor"]["a_outcomes"] == {"invalid": 20} and rows["invalid-tensor"]["a_device_jobs"] == 0
    assert rows["kv-exhausted"]["a_outcomes"].get("capacity", 0) > 0
    assert rows["submit-busy"]["faults_fired"] == 10 and rows["submit-busy"]["recoveries"] == []
    (rec,) = rows["wait-timeout"]["recoveries"]  # the plan leaves wait-timeouts at the mock's chip reset: A only
    assert rec["scope"] == "chip" and rec["affected_aliases"] == ["model-a"] and rec["ok"]
    recs = rows["ccu-exception"]["recoveries"]  # and takes the whole board for a CCU exception: A and B
    assert recs and {a for r in recs for a in r["affected_aliases"]} == {"model-a", "model-b"}, recs
    for name in ("invalid-tensor", "kv-exhausted", "submit-busy"):
        assert rows[name]["b_impacted"] is False, rows[name]
        assert rows[name]["b_succeeded"] == rows[name]["b_requests"] > 0
    # A combined calbin reconfigures as a whole (001 §11.2): reloading A stops B too, and the report says so.
    assert rows["unload-reload"]["b_impacted"] is True and "A and B" in rows["unload-reload"]["scope_granted"]
    assert doc["verdict"] == "F1"
    assert (out / "fault-isolation" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serialize_chips_makes_g3_no_go_with_the_reports_action(tmp_path: Path) -> None:
    out = tmp_path / "r"
    code, stdout, stderr = run_accept(
        "accept", COMBINED, *TRUST, "--only", "G3", "--serialize-chips", "--report", out, "--format", "junit"
    )
    assert code == 1, stderr[-2000:]
    g3 = rows_by_id(json.loads((out / "report.json").read_text()))["G3"]
    assert g3["verdict"] == "NO-GO", g3
    assert g3["action"].startswith("declare S1 only, investigate the global runtime lock / shared bottleneck")
    assert g3["key_figure"].startswith("S1") and "--serialize-chips" in g3["reason"]
    # --format junit on stdout: the NO-GO is the one failure, with the action; the rows not asked for are skipped.
    suite = ET.fromstring(stdout).find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("skipped") == "10"
    failure = next(c for c in suite.findall("testcase") if c.find("failure") is not None)
    assert failure.get("name", "").startswith("G3")
    assert "declare S1 only" in (failure.find("failure").get("message") or "")  # type: ignore[union-attr]
    assert "NO-GO: 0 GO, 1 NO-GO (G3)" in stderr


def test_a_kv_corruption_plan_makes_g2_no_go_naming_the_request(tmp_path: Path) -> None:
    plan = tmp_path / "kv.yaml"
    # model-a1 only: the device check's known answers (the bundled combined sample's model-a and model-b) pass,
    # so the run reaches the isolation scenario (a board whose every job is corrupt is stopped at the check)
    plan.write_text(
        "schema: calctl-fault-plan/v1\nfaults:\n  - kind: kv_corruption\n    probability: 0.5\n    model: model-a1\n"
    )
    code, stdout, stderr = run_accept(
        "accept", REPLICA, *TRUST, "--only", "G2", "--fault-plan", plan, "--report", tmp_path / "r", "--format", "json"
    )
    assert_no_traceback_text(stdout + stderr)
    assert code == 1, stderr[-2000:]
    g2 = rows_by_id(json.loads(stdout))["G2"]
    assert g2["verdict"] == "NO-GO" and "不进入不同模型阶段" in g2["action"], g2
    assert "chip" in g2["reason"] and g2["files"], g2  # names the request (or the load golden), alias and chip


def test_an_interrupted_run_leaves_a_partial_report(tmp_path: Path) -> None:
    out = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "calctl", "accept", str(COMBINED), *TRUST, "--only", "G3,G4", "--report", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    try:

        def poc_done() -> bool:
            try:
                doc = json.loads((out / "report.json").read_text())
            except (OSError, ValueError):
                return False
            return any(s["name"] == "poc" and s["status"] in ("PASS", "WARN", "FAIL") for s in doc["steps"])

        wait_until(poc_done, what="the PoC step in report.json", timeout=120)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err.decode()[-2000:]
    doc = json.loads((out / "report.json").read_text())
    assert doc["status"] == "interrupted" and doc["exit_code"] == 130
    rows = rows_by_id(doc)
    assert rows["G3"]["verdict"] == "GO"  # measured before the signal, evidence on disk
    assert rows["G4"]["verdict"] == "NOT MEASURED" and "interrupted" in rows["G4"]["reason"], rows["G4"]
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["fault-isolation"]["status"] == "INTERRUPTED" and "SIGTERM" in steps["fault-isolation"]["detail"]
    assert all(steps[n]["status"] == "INTERRUPTED" for n in ("soak", "rollback")), steps


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--level", "bogus"), "bogus"),
        (("--only", "G9"), "G9"),
        (("--device", "calrt", "--serialize-chips"), "--serialize-chips"),
    ],
)
def test_bad_options_are_usage_errors(cli, tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    r = cli("accept", COMBINED, *TRUST, "--report", tmp_path / "r", *args)
    assert_no_traceback(r)
    assert r.code == 2 and needle in r.err, r.err


def test_missing_package_and_bad_fault_plan_are_usage_errors(cli, tmp_path: Path) -> None:
    r = cli("accept", tmp_path / "nope", *TRUST, "--report", tmp_path / "r")
    assert_no_traceback(r)
    assert r.code == 2 and "nope" in r.err, r.err
    r = cli("accept", COMBINED, *TRUST, "--replica", tmp_path / "gone", "--report", tmp_path / "r")
    assert r.code == 2 and "--replica" in r.err and "gone" in r.err, r.err
    r = cli("accept", COMBINED, *TRUST, "--previous", tmp_path / "old", "--report", tmp_path / "r")
    assert r.code == 2 and "--previous" in r.err and "old" in r.err, r.err
    plan = tmp_path / "plan.yaml"
    plan.write_text("schema: calctl-fault-plan/v1\nfaults:\n  - kind: ccu_exception\n")
    r = cli("accept", COMBINED, *TRUST, "--fault-plan", plan, "--report", tmp_path / "r2")
    assert_no_traceback(r)
    assert r.code == 2 and "plan.yaml" in r.err and "probability" in r.err, r.err
    assert not (tmp_path / "r2" / "report.json").exists()
