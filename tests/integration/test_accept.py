"""Issue 20 acceptance: ``calctl accept``, the G0–G5 / M0–M4 report from evidence (docs/accept.md).

The quick level on the mock (combined package + replica package) runs twice, split by ``--only``: the timed
rows (G3, G4; judged on the device's own job intervals, so at any host load) under a fault plan whose CCU
fault takes the whole board (G4 gets the grade the fault-isolation scenario measures), and the others.
The other tests measure one row each with ``--only`` so they stay short: ``--serialize-chips`` makes G3
NO-GO with the report's action, an interrupted run leaves a partial report, and bad options exit 2.
The quick level also runs through the C reference board (``--device calrt``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURE_PACKAGES, REPO, TEST_KEY, TEST_PUB, Cli, assert_no_traceback
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)
from tests.waiting import wait_until

COMBINED = FIXTURE_PACKAGES / "combined"
REPLICA = FIXTURE_PACKAGES / "replica"
TRUST = ("--trusted-key", str(TEST_PUB))
pytestmark = pytest.mark.slow  # two quick-level runs (mock, reference board) and one fault-isolation run

ROW_IDS = ["G0", "G1", "G2", "G3", "G4", "G5", "M0", "M1", "M2", "M3", "M4"]


def _run(*args: str | Path) -> tuple[int, str, str]:
    """calctl in-process, stdout and stderr captured (usable from a module-scoped fixture)."""
    from calctl.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in doc["rows"]}


def _quick(out: Path, only: str, *extra: str | Path) -> tuple[int, dict[str, Any], Path, str]:
    code, stdout, stderr = _run(
        "accept", COMBINED, "--replica", REPLICA, *TRUST, "--level", "quick", "--only", only, *extra,
        "--report", out, "--format", "json",
    )  # fmt: skip
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    return code, json.loads(stdout), out, stderr


# The quick level in two runs: the timed rows (G3 overlap, the G4 grade; on the device's clock), and G0-G2,
# G5, M0, M3 and M4. M1/M2 (the executor-modes
# scenario) are measured by tests/integration/test_executor_modes.py on the mock and, as rows of one run of
# every row in one report, by test_quick_level_through_the_reference_board.
TIMED_ROWS = ("G3", "G4")
OTHER_ROWS = tuple(r for r in ROW_IDS if r not in (*TIMED_ROWS, "M1", "M2"))
# This board's CCU faults take the whole board (reset_scope: board; probability 0, so it is the fault-isolation
# scenario's own ccu-exception phase that fires one); its wait-timeouts keep the default chip scope.
BOARD_WIDE_CCU = (
    "schema: calctl-fault-plan/v1\nfaults:\n  - kind: ccu_exception\n    probability: 0\n    reset_scope: board\n"
)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second signed version of the combined fixture (same models, other weights: seed 1), built now with the
    test-only key, as `calctl sample-package --kind combined --seed 1` would: the version PKG replaces."""
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private

    return build_sample(
        tmp_path_factory.mktemp("previous") / "combined-v0", kind="combined", key=load_private(TEST_KEY), seed=1
    )


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory, previous: Path) -> tuple[int, dict[str, Any], Path, str]:
    return _quick(tmp_path_factory.mktemp("accept-quick") / "report", ",".join(OTHER_ROWS), "--previous", previous)


@pytest.fixture(scope="module")
def quick_timed(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path, str]:
    tmp = tmp_path_factory.mktemp("accept-quick-timed")
    plan = tmp / "ccu-board.yaml"
    plan.write_text(BOARD_WIDE_CCU, encoding="utf-8")
    return _quick(tmp / "report", ",".join(TIMED_ROWS), "--fault-plan", plan)


def _assert_rows_shape(doc: dict[str, Any], out: Path, asked: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    rows = _rows(doc)
    assert list(rows) == ROW_IDS
    for r in rows.values():
        assert r["verdict"] in ("GO", "NOT MEASURED"), r
        assert r["condition"] and "§" in r["source"], r
        if r["id"] not in asked:
            assert r["verdict"] == "NOT MEASURED" and r["reason"].startswith("not asked for: --only"), r
        elif r["verdict"] == "NOT MEASURED":
            assert r["reason"] and r["how_to_measure"], r
        else:
            assert r["files"], r
            for path in r["files"].values():
                assert (out / path).is_file(), (r["id"], path)
    assert "NOT MEASURED" in doc["summary"] and doc["status"] == "finished"
    assert doc["mock_result"] is True and "MOCK RESULT" in doc["note"]
    return rows


def test_quick_level_reports_every_row_go_or_not_measured_with_the_reason(
    quick: tuple[int, dict[str, Any], Path, str],
) -> None:
    code, doc, out, _ = quick
    assert code == 0, doc["summary"]
    rows = _assert_rows_shape(doc, out, OTHER_ROWS)
    # What the quick level measures on the mock, exactly:
    for rid in ("G0", "G1", "G2"):
        assert rows[rid]["verdict"] == "GO", rows[rid]
    # The durations of the report are not reached at the quick level: said with what was reached.
    assert rows["G5"]["verdict"] == "NOT MEASURED" and "/100 cycles" in rows["G5"]["reason"]
    assert "h/24 h" in rows["G5"]["reason"] and "--level long" in rows["G5"]["how_to_measure"]
    assert rows["M0"]["verdict"] == "NOT MEASURED" and "h/24 h" in rows["M0"]["reason"]
    assert rows["M4"]["verdict"] == "NOT MEASURED" and "h/8 h" in rows["M4"]["reason"]
    assert rows["M3"]["verdict"] == "NOT MEASURED" and "B4" in rows["M3"]["reason"]  # the fixture is B1 only


def test_quick_level_isolation_is_the_default_thousand_requests(quick: tuple[int, dict[str, Any], Path, str]) -> None:
    """G2's evidence: ``bench --scenario isolation`` at its default of 1000 requests (001 §13.1), all judged."""
    _, doc, out, _ = quick
    iso = json.loads((out / "isolation" / "bench-report.json").read_text())
    assert iso["scenario"] == "isolation" and iso["verdict"] == "GO" and iso["mock_result"] is True
    assert iso["requests"]["sent"] == 1000 and iso["requests"]["threshold_met"] is True
    assert iso["requests"]["failed"] == 0 and iso["crosstalk"] == []
    assert all(c["fail"] == 0 for c in iso["checks"].values()) and iso["checks"]["served"]["pass"] == 1000
    assert _rows(doc)["G2"]["key_figure"] == "1000 requests, 0 offender(s)"


def test_quick_level_timed_rows_and_a_board_wide_ccu_fault(quick_timed: tuple[int, dict[str, Any], Path, str]) -> None:
    """001 §13.4: F1 is "request and resource faults isolated, but CCU/timeout/reset share the fault domain".

    The fault plan says this board's CCU faults take the whole board. The grade is what the fault-isolation
    scenario measures, and G4 follows the report's rule: Go iff >= F1 and every recovery succeeded with both
    models Ready again, NO-GO "recovery not deterministic" otherwise."""
    code, doc, out, _ = quick_timed
    rows = _assert_rows_shape(doc, out, TIMED_ROWS)
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


def test_quick_level_fault_isolation_grades_f1_phase_by_phase(
    quick_timed: tuple[int, dict[str, Any], Path, str],
) -> None:
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


def test_quick_level_files_json_junit_and_picture(quick: tuple[int, dict[str, Any], Path, str]) -> None:
    _, doc, out, _ = quick
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["rows"] == doc["rows"] and on_disk["status"] == "finished"
    assert (out / "accept.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("soak/soak-report.json", "soak/events.ndjson", "run-golden.png", "rollback.json"):
        assert (out / name).is_file(), name
    rb = json.loads((out / "rollback.json").read_text())
    assert rb["ok"] is True and rb["problems"] == [], rb["problems"]
    assert rb["digests"]["previous"] != rb["digests"]["package"]  # a version change, not PKG reloaded onto itself
    suite = ET.parse(out / "accept.junit.xml").getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name", "").split()[0] for c in cases] == ROW_IDS
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(skipped) == doc["counts"]["NOT MEASURED"] and suite.get("failures") == "0"
    for c in skipped:
        assert (c.findall("skipped")[0].get("message") or "").startswith("NOT MEASURED: ")


def test_with_previous_the_rollback_rolls_forward_and_back_under_traffic(
    quick: tuple[int, dict[str, Any], Path, str], previous: Path
) -> None:
    """Issue 29 item 7, with ``--previous``: the old version serves, PKG is rolled forward onto it and one call
    takes it back, all while clients stream to both models (001 §17 G5, 000 §19 M4)."""
    _, doc, out, _ = quick
    rb = json.loads((out / "rollback.json").read_text())
    assert rb["previous"] == str(previous) and rb["package"] == str(COMBINED)
    assert [a["action"] for a in rb["actions"]] == ["start", "reload", "rollback"]
    assert all(a["ok"] for a in rb["actions"]) and rb["actions"][-1]["package"] == str(previous)
    stages = {s["stage"]: s for s in rb["stages"]}
    assert list(stages) == ["serving-previous", "roll-forward", "serving-package", "rollback", "rolled-back"]
    want = [rb["digests"][k] for k in ("previous", "package", "previous")]
    assert [stages[n]["serving_digest"] for n in ("serving-previous", "serving-package", "rolled-back")] == want
    for alias in ("model-a", "model-b"):
        gens = [stages[n]["generations"][alias] for n in ("serving-previous", "serving-package", "rolled-back")]
        assert gens[0] < gens[1] < gens[2], gens
        for name, st in stages.items():  # under traffic: every stage served, nothing failed but 503s
            assert set(st["requests"][alias]) <= {"ok", "unavailable"}, (name, st["requests"])
            if not name.startswith(("roll-forward", "rollback")):
                assert st["requests"][alias].get("ok", 0) > 0, (name, st["requests"])
        assert stages["rolled-back"]["probe"][alias] == stages["serving-previous"]["probe"][alias]
    # "no request got tokens of two generations", recomputed from the file
    per_request = [r for st in stages.values() for r in st["request_generations"]]
    assert per_request and all(len(r["token_generations"]) <= 1 for r in per_request)
    assert {r["outcome"] for r in per_request} <= {"ok", "unavailable"}
    assert rb["probe_changed_with_version"] == {"model-a": True, "model-b": True}  # other weights, other tokens
    rows = _rows(doc)
    for rid in ("G5", "M4"):
        assert rows[rid]["key_figure"].endswith("rollback ok"), rows[rid]
        assert "rollback.report" in rows[rid]["files"] and "no --previous" not in rows[rid]["reason"]
        assert any(
            e.startswith("rollback: combined-v0 -> combined -> rollback to combined-v0") for e in rows[rid]["evidence"]
        )


def test_without_previous_the_rollback_rows_say_not_measured_and_how(tmp_path: Path) -> None:
    """Issue 29 item 7, without ``--previous``: no rollback is run (PKG reloaded onto itself is no version
    change) and M4 says its rollback part is NOT MEASURED, and how to measure it."""
    out = tmp_path / "r"
    code, stdout, _ = _run("accept", COMBINED, *TRUST, "--only", "M4", "--report", out, "--format", "table")
    assert code == 0, stdout[-3000:]
    doc = json.loads((out / "report.json").read_text())
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["rollback"]["status"] == "SKIPPED" and "no --previous" in steps["rollback"]["reason"]
    assert not (out / "rollback.json").exists()
    m4 = _rows(doc)["M4"]
    assert doc["verdict"] == "NOT MEASURED" and doc["exit_code"] == 0  # no row GO: never a GO verdict
    assert m4["verdict"] == "NOT MEASURED" and m4["key_figure"].endswith("rollback not measured"), m4
    assert "rollback not run: no --previous package given" in m4["reason"] and "3/100" in m4["reason"]
    assert m4["how_to_measure"].startswith("`calctl accept PKG --level long --previous OLD_PKG`")
    assert "rollback.report" not in m4["files"]
    flat = " ".join(stdout.split())
    assert "M4 NOT MEASURED:" in flat and "no --previous package given" in flat and "--previous OLD_PKG" in flat


def test_previous_naming_pkg_itself_is_no_version_change(tmp_path: Path) -> None:
    from calctl.runners.acceptance.rollback import RollbackRun, SamePackage
    from calctl.runners.device import DeviceSpec
    from calctl.signing.policy import make_policy

    run = RollbackRun(
        package=COMBINED,
        previous=COMBINED,
        device=DeviceSpec(),
        trust=make_policy([TEST_PUB]),
        traffic_s=0.1,
        stage_timeout_s=5.0,
    )
    with pytest.raises(SamePackage, match="same package as PKG"):
        run.run()


def test_a_previous_with_other_models_or_none_is_refused_before_any_step(tmp_path: Path) -> None:
    """--previous is validated up front, with PKG's aliases: a replica (model-a0/a1) or a FIFO is exit 1 naming
    the finding before a step runs (the rollback is the last step: after the soak)."""
    for name, prev in (("replica", REPLICA), ("fifo", tmp_path / "pipe")):
        if name == "fifo":
            os.mkfifo(prev)
        out = tmp_path / name
        code, _, err = _run("accept", COMBINED, *TRUST, "--only", "M4", "--previous", prev, "--report", out)
        assert code == 1, err[-2000:]
        assert f"--previous {prev}: the package failed validation" in " ".join(err.split()), err
        assert not (out / "report.json").exists()  # refused before the first step
    _, _, err = _run("accept", COMBINED, *TRUST, "--only", "M4", "--previous", REPLICA, "--report", tmp_path / "x")
    assert "MAN004" in err and "PKG serves model-a, model-b" in " ".join(err.split()), err


def test_previous_with_the_same_files_under_a_rewritten_checksum_file_is_no_version_change(tmp_path: Path) -> None:
    import shutil

    from calctl.runners.acceptance.rollback import RollbackRun, SamePackage
    from calctl.runners.device import DeviceSpec
    from calctl.signing.keys import load_private
    from calctl.signing.policy import make_policy
    from calctl.signing.seal import sign

    copy = tmp_path / "resealed"
    shutil.copytree(COMBINED, copy)
    sums = copy / "checksums.sha256"
    sums.write_bytes(b"".join(reversed(sums.read_bytes().splitlines(keepends=True))))  # same files, other bytes
    sign(copy, load_private(TEST_KEY))
    run = RollbackRun(
        package=COMBINED,
        previous=copy,
        device=DeviceSpec(),
        trust=make_policy([TEST_PUB]),
        traffic_s=0.1,
        stage_timeout_s=5.0,
    )
    with pytest.raises(SamePackage, match="holds the same files as PKG"):
        run.run()


def test_serialize_chips_makes_g3_no_go_with_the_reports_action(tmp_path: Path) -> None:
    out = tmp_path / "r"
    code, stdout, stderr = _run(
        "accept", COMBINED, *TRUST, "--only", "G3", "--serialize-chips", "--report", out, "--format", "junit"
    )
    assert code == 1, stderr[-2000:]
    g3 = _rows(json.loads((out / "report.json").read_text()))["G3"]
    assert g3["verdict"] == "NO-GO", g3
    assert g3["action"].startswith("declare S1 only, investigate the global runtime lock / shared bottleneck")
    assert g3["key_figure"].startswith("S1") and "--serialize-chips" in g3["reason"]
    # --format junit on stdout: the NO-GO is the one failure, with the action; the rows not asked for are skipped.
    suite = ET.fromstring(stdout).find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("skipped") == "10"
    failure = next(c for c in suite.findall("testcase") if c.find("failure") is not None)
    assert failure.get("name", "").startswith("G3")
    assert "declare S1 only" in (failure.findall("failure")[0].get("message") or "")
    assert "NO-GO: 0 GO, 1 NO-GO (G3)" in stderr


def test_a_kv_corruption_plan_makes_g2_no_go_naming_the_request(tmp_path: Path) -> None:
    plan = tmp_path / "kv.yaml"
    plan.write_text("schema: calctl-fault-plan/v1\nfaults:\n  - kind: kv_corruption\n    probability: 0.5\n")
    code, stdout, stderr = _run(
        "accept", REPLICA, *TRUST, "--only", "G2", "--fault-plan", plan, "--report", tmp_path / "r", "--format", "json"
    )
    assert_no_traceback_text(stdout + stderr)
    assert code == 1, stderr[-2000:]
    g2 = _rows(json.loads(stdout))["G2"]
    assert g2["verdict"] == "NO-GO" and "不进入不同模型阶段" in g2["action"], g2
    assert "chip" in g2["reason"] and g2["files"], g2  # names the request (or the load golden), alias and chip


def assert_no_traceback_text(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]


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
            return any(s["name"] == "poc" and s["status"] == "RAN" for s in doc["steps"])

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
    rows = _rows(doc)
    assert rows["G3"]["verdict"] == "GO"  # measured before the signal, evidence on disk
    assert rows["G4"]["verdict"] == "NOT MEASURED" and "interrupted" in rows["G4"]["reason"], rows["G4"]
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["fault-isolation"]["status"] == "INTERRUPTED" and "SIGTERM" in steps["fault-isolation"]["reason"]
    assert all(steps[n]["status"] == "INTERRUPTED" for n in ("soak", "rollback")), steps


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--level", "bogus"), "bogus"),
        (("--only", "G9"), "G9"),
        (("--device", "calrt", "--serialize-chips"), "--serialize-chips"),
    ],
)
def test_bad_options_are_usage_errors(cli: Cli, tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    r = cli("accept", COMBINED, *TRUST, "--report", tmp_path / "r", *args)
    assert_no_traceback(r)
    assert r.code == 2 and needle in r.err, r.err


def test_missing_package_and_bad_fault_plan_are_usage_errors(cli: Cli, tmp_path: Path) -> None:
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


def test_quick_level_through_the_reference_board(tmp_path: Path, reference_board: Path) -> None:  # noqa: F811
    """The same quick level through the C ABI. What the board's timing gives (S1/S2, every request served within
    its timeout) is measured, not asserted: the rows that need the mock's fault injection are NOT MEASURED with
    the reason, and every other row is measured (GO or NO-GO), calrt-labelled, its evidence on disk."""
    out = tmp_path / "r"
    code, stdout, stderr = _run(
        "accept",
        COMBINED,
        "--replica",
        REPLICA,
        *TRUST,
        "--device",
        "calrt",
        "--calrt-lib",
        reference_board,
        "--level",
        "quick",
        "--report",
        out,
        "--format",
        "json",
    )
    assert_no_traceback_text(stdout + stderr)
    doc = json.loads(stdout)
    rows = _rows(doc)
    assert doc["status"] == "finished" and list(rows) == ROW_IDS
    assert code == (1 if doc["counts"]["NO-GO"] else 0), doc["summary"]
    assert doc["device"] == "calrt" and doc["mock_result"] is False
    assert doc["device_label"] == "software model" and doc["note"].startswith("SOFTWARE MODEL RESULT"), doc["note"]
    assert doc["device_options"]["calrt_lib"] == str(reference_board)
    for rid in ("G0", "G1"):
        assert rows[rid]["verdict"] == "GO", rows[rid]
    for rid in ("G2", "G3"):  # measured through the C ABI, whatever the verdict
        assert rows[rid]["verdict"] in ("GO", "NO-GO"), rows[rid]
        assert all((out / p).is_file() for p in rows[rid]["files"].values()), rows[rid]
    assert rows["G4"]["verdict"] == "NOT MEASURED" and "mock" in rows["G4"]["reason"], rows["G4"]
    assert rows["G5"]["verdict"] == "NOT MEASURED" and "/100 cycles" in rows["G5"]["reason"]
    assert "no --previous package given" in rows["G5"]["reason"]  # run without one: the rollback is not measured
    g3 = json.loads((out / "poc.json").read_text())
    assert g3["device"] == "calrt" and g3["runtime"]["firmware"] == "reference (software model, no hardware)"
    # M1/M2 from the executor-modes scenario at the quick level's 3 rounds, through the C ABI.
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["executor-modes"]["status"] == "RAN", steps["executor-modes"]
    assert rows["M1"]["files"] and all((out / p).is_file() for p in rows["M1"]["files"].values()), rows["M1"]
    assert rows["M2"]["verdict"] != "GO", rows["M2"]  # 24 h of ping/pong is never reached at the quick level
