"""``calctl lab run`` against a real labgrid lab on loopback (issue 52 item 2; docs/lab.md, "Tested").

A labgrid 26 coordinator and three exporters of five mock Calculet boards, each with its own seed, one with a
fault plan that corrupts model-b's logits; the third exporter's board is reached through a local sshd (its
``host`` is an SSH host: the command runs over labgrid's SSH connection and its report directory comes back
as a tar stream). The tests run in file order (one module-scoped lab):

1. one ``lab run`` over every place gives one fleet report of five distinct boards: the faulty board FAIL,
   the others PASS or WARN, no infrastructure row, every board's report and JUnit back on the client;
2. two ``lab run``s at once over the same places both complete every board: each place is run by one job at
   a time (the second waited for it), none fails for being busy;
3. places another user holds past ``--timeout`` are infrastructure errors naming the holder; of two runs
   waiting for them, the one with the higher ``--priority`` gets every place first;
4. SIGINT stops the run, unlocks every place and cancels every reservation (exit 130);
5. an exporter killed while its boards run gives an infrastructure ERROR naming the place and its exporter
   for each of its boards (never FAIL) and complete reports for the rest; a later run's places of that
   exporter, allocated although it is offline (labgrid#1477), are infrastructure errors too;
6. a lab's own pytest suite gets the board through ``--lg-env`` and the ``calctl_board`` fixture, for a local
   board and for a locked place whose board is behind SSH.

Skips only when labgrid (the ``lab`` extra) or an sshd cannot be installed here; .ci/run installs both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calctl.runners.bringup import STEPS
from tests.integration.lab_harness import (
    REPO,
    SSH_HOST,
    Lab,
    calctl_command,
    lab,
    labgrid_bin,
    sshd,
    sshd_missing,
    wait_for_line,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

FAULT_PLAN = """schema: calctl-fault-plan/v1
faults:
  - kind: corrupt_output
    probability: 1.0
    model: model-b
    magnitude: 4.0
"""
#: exporter -> its boards (board id, mock seed, faulty); exporter-c's board is reached through the sshd.
BOARDS = {
    "exporter-a": [("lab-b0", 11, False), ("lab-b1", 22, True)],
    "exporter-b": [("lab-b2", 33, False), ("lab-b3", 44, False)],
    "exporter-c": [("lab-b4", 55, False)],
}
ALL = [b for boards in BOARDS.values() for b, _, _ in boards]
FAULTY = "lab-b1"
_PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
_LAB_RUN = (sys.executable, "-m", "calctl", "lab", "run")
HANG_BOUND_S = 1200  # bounds a hang only: a loaded 2-core machine runs five bring-ups in a minute or two


def _missing() -> str | None:
    try:
        import labgrid  # noqa: F401
    except ImportError:
        return "labgrid is not installed (the test extra installs it: pip install -e '.[test]')"
    if labgrid_bin("labgrid-coordinator") is None or labgrid_bin("labgrid-exporter") is None:
        return "labgrid's console scripts (labgrid-coordinator, labgrid-exporter) are not installed"
    return sshd_missing()


@pytest.fixture(scope="module")
def the_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    why = _missing()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("lab")
    fault = root / "fault-plan.yaml"
    fault.write_text(FAULT_PLAN)
    with sshd(root / "sshd") as ssh:
        env = {
            **os.environ,
            "PATH": f"{ssh.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO),
            "COLUMNS": "200",
        }
        # The remote board's host gets this checkout's calctl and the suite's cache (nothing under ~).
        remote_env: dict[str, str] = {k: env[k] for k in ("CALCTL_CACHE_DIR", "CALCTL_LOCK_DIR") if k in env}
        remote_work = root / "remote-work"
        remote_work.mkdir()
        with lab(root / "lab", env) as the:
            for exporter, boards in BOARDS.items():
                lines = []
                for board, seed, faulty in boards:
                    lines += [f"{board}:", "  CalculetBoard:", f"    board_id: {board}", f"    mock_seed: {seed}"]
                    if faulty:
                        lines.append(f"    fault_plan: {fault}")
                    if exporter == "exporter-c":
                        lines += [
                            f"    host: {SSH_HOST}",
                            f"    calctl: {calctl_command(remote_env)}",
                            f"    workdir: {remote_work}",
                        ]
                    else:
                        lines.append(f"    calctl: {calctl_command()}")
                the.start_exporter(exporter, "\n".join(lines) + "\n")
            the.wait_resources([f"{e}/{b}/CalculetBoard" for e, boards in BOARDS.items() for b, _, _ in boards])
            for i, board in enumerate(ALL):
                the.add_place(board, f"*/{board}/CalculetBoard", ["board=calculet", f"rack={1 + i % 2}"])
            yield the


def _lab_run(the: Lab, out: Path, *command: str, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    args = [*_LAB_RUN, "--tags", "board=calculet", "--out", str(out), *extra]
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115  # inherited by the child
    out.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.Popen(
            [*args, "--", *command], stdout=log, stderr=subprocess.STDOUT, env=the.env, start_new_session=True
        )
    finally:
        log.close()


def _wait(proc: subprocess.Popen[bytes], out: Path) -> int:
    try:
        return proc.wait(HANG_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        tail = out.with_suffix(".log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"calctl lab run hung: {tail}") from None


def _fleet(out: Path) -> dict[str, Any]:
    doc = json.loads((out / "fleet-report.json").read_text())
    assert isinstance(doc, dict)
    return doc


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["board_id"]: r for r in doc["boards"]}


def test_one_run_over_five_boards_gives_one_fleet_report(the_lab: Lab) -> None:
    out = the_lab.root.parent / "run-all"
    proc = _lab_run(the_lab, out, "bringup", "--level", "quick")
    code = _wait(proc, out)
    log = out.with_suffix(".log").read_text(errors="replace")
    doc = _fleet(out)
    rows = _rows(doc)
    assert sorted(rows) == sorted(ALL), log[-3000:]
    assert not [r for r in rows.values() if r["infrastructure"]], (doc["reasons"], log[-3000:])
    # the fault plan corrupts the board's answers: bringup's device check (its first step) is where it shows
    assert rows[FAULTY]["verdict"] == "FAIL" and "device-check" in rows[FAULTY]["reason"], rows[FAULTY]
    assert all(r["verdict"] in ("PASS", "WARN") for b, r in rows.items() if b != FAULTY), rows
    assert doc["verdict"] == "FAIL" and code == 1, log[-3000:]
    # five distinct identities, each the board's own seed; the fault plan only on the faulty board
    seeds = {b: s for boards in BOARDS.values() for b, s, _ in boards}
    assert {b: r["seed"] for b, r in rows.items()} == seeds
    assert [b for b, r in rows.items() if r["fault_plan"]] == [FAULTY]
    assert all(r["device_label"] == "mock" for r in rows.values()) and "MOCK RESULT" in (doc["note"] or "")
    # every board's evidence came back, the SSH board's through the tar stream (its remote directory removed)
    for board in ALL:
        report = json.loads((out / board / "report.json").read_text())
        assert report["command"] == "bringup" and (out / board / "report.html").is_file()
        junit = ET.parse(out / board / "junit.xml").getroot()
        assert junit.find("testsuite") is not None and junit.get("tests") == str(len(STEPS))
        assert "plan:" in (out / board / "calctl.log").read_text()
    assert rows["lab-b4"]["place"] and SSH_HOST in rows["lab-b4"]["place"]
    assert not list((the_lab.root.parent / "remote-work").iterdir()), "the remote run directory was left behind"
    fleet_junit = ET.parse(out / "fleet-junit.xml").getroot()
    suites = [s.get("name", "") for s in fleet_junit.findall("testsuite")]
    assert sorted(s.split(":")[0] for s in suites) == sorted(ALL)
    assert fleet_junit.get("failures") == "1"
    # the places are free again and no reservation is left
    assert "acquired: None" in the_lab.client("-p", "lab-b0", "show").stdout
    assert the_lab.client("reservations").stdout.strip() == ""


def test_two_concurrent_runs_wait_for_the_places(the_lab: Lab) -> None:
    outs = [the_lab.root.parent / "concurrent-1", the_lab.root.parent / "concurrent-2"]
    procs = [_lab_run(the_lab, out, "device", "check") for out in outs]
    codes = [_wait(p, o) for p, o in zip(procs, outs, strict=True)]
    spans: dict[str, list[tuple[float, float]]] = {b: [] for b in ALL}
    for out, code in zip(outs, codes, strict=True):
        rows = _rows(_fleet(out))
        log = out.with_suffix(".log").read_text(errors="replace")
        assert sorted(rows) == sorted(ALL), log[-3000:]
        assert not [r for r in rows.values() if r["infrastructure"]], log[-3000:]
        assert rows[FAULTY]["verdict"] == "FAIL" and code == 1, log[-3000:]
        assert all(r["verdict"] in ("PASS", "WARN") for b, r in rows.items() if b != FAULTY)
        for board in ALL:
            run = json.loads((out / board / "lab-run.json").read_text())
            spans[board].append((run["started_at"], run["ended_at"]))
    # one job at a time on each board: the two runs of a board never overlap (the later one waited)
    for board, ((a0, a1), (b0, b1)) in spans.items():
        assert a1 <= b0 or b1 <= a0, f"{board} ran for both jobs at once: {spans[board]}"


def test_places_held_past_the_timeout_are_infrastructure_errors(the_lab: Lab) -> None:
    """Another user holds every place: each board is an infrastructure ERROR naming the holder after --timeout
    (never a FAIL), and with --count only the boards short of the count are rows."""
    for board in ALL:
        the_lab.client("-p", board, "acquire")
    try:
        out = the_lab.root.parent / "held"
        code = _wait(_lab_run(the_lab, out, "device", "check", extra=("--timeout", "2")), out)
        rows = _rows(_fleet(out))
        assert code == 3 and sorted(rows) == sorted(ALL)
        for row in rows.values():
            assert row["infrastructure"] and "not free within --timeout 2 s (held by " in row["reason"], row
        counted = the_lab.root.parent / "held-count"
        code = _wait(_lab_run(the_lab, counted, "device", "check", extra=("--timeout", "2", "--count", "2")), counted)
        rows = _rows(_fleet(counted))
        assert code == 3 and sorted(rows) == ["(board 1 of 2)", "(board 2 of 2)"], rows
        assert "places tagged board=calculet" in rows["(board 1 of 2)"]["reason"]
    finally:
        for board in ALL:
            the_lab.client("-p", board, "release")
    assert the_lab.client("reservations").stdout.strip() == ""


def test_a_higher_priority_run_gets_each_place_first(the_lab: Lab) -> None:
    """Two runs wait for held places; the later one has --priority 5: when the places come free, it runs on
    every board before the earlier run of priority 0 (labgrid orders reservations by priority, then age)."""
    for board in ALL:
        the_lab.client("-p", board, "acquire")
    outs = {"low": the_lab.root.parent / "prio-low", "high": the_lab.root.parent / "prio-high"}
    try:
        low = _lab_run(the_lab, outs["low"], "device", "check")
        wait_until(
            lambda: the_lab.client("reservations").stdout.count("Reservation '") == len(ALL),
            what="the first run's reservations",
            timeout=120,
            interval=0.2,
        )
        high = _lab_run(the_lab, outs["high"], "device", "check", extra=("--priority", "5"))
        wait_until(
            lambda: the_lab.client("reservations").stdout.count("Reservation '") == 2 * len(ALL),
            what="both runs' reservations",
            timeout=120,
            interval=0.2,
        )
    finally:
        for board in ALL:
            the_lab.client("-p", board, "release")
    assert _wait(high, outs["high"]) == 1 and _wait(low, outs["low"]) == 1
    for board in ALL:
        started = {k: json.loads((o / board / "lab-run.json").read_text())["started_at"] for k, o in outs.items()}
        assert started["high"] < started["low"], (board, started)


def test_an_interrupted_run_unlocks_every_place(the_lab: Lab) -> None:
    """SIGINT (a CI job cancelled) stops the boards' commands, unlocks every place and cancels every reservation
    before the fleet report (INTERRUPTED, exit 130) is written: the lab is left as it was found."""
    out = the_lab.root.parent / "interrupted"
    proc = _lab_run(the_lab, out, "bringup", "--level", "quick")
    for board in ("lab-b0", "lab-b4"):  # a board here and the board behind SSH are under way
        wait_for_line(out / board / "calctl.log", "plan:", proc)
    proc.send_signal(signal.SIGINT)
    code = _wait(proc, out)
    log = out.with_suffix(".log").read_text(errors="replace")
    assert code == 130, log[-3000:]
    doc = _fleet(out)
    assert doc["verdict"] == "INTERRUPTED" and "Traceback" not in log
    for board in ("lab-b0", "lab-b4"):  # each command wrote its own INTERRUPTED report, the remote one came back
        assert json.loads((out / board / "report.json").read_text())["verdict"] == "INTERRUPTED", board
    assert not list((the_lab.root.parent / "remote-work").iterdir())
    for board in ALL:
        assert "acquired: None" in the_lab.client("-p", board, "show").stdout, board
    assert the_lab.client("reservations").stdout.strip() == ""


def test_an_exporter_that_goes_away_is_an_infrastructure_error(the_lab: Lab) -> None:
    out = the_lab.root.parent / "exporter-gone"
    proc = _lab_run(the_lab, out, "bringup", "--level", "quick")
    gone = [b for b, _, _ in BOARDS["exporter-b"]]
    for board in gone:  # both of exporter-b's boards are under way
        wait_for_line(out / board / "calctl.log", "plan:", proc)
    the_lab.kill_exporter("exporter-b")
    code = _wait(proc, out)
    log = out.with_suffix(".log").read_text(errors="replace")
    doc = _fleet(out)
    rows = _rows(doc)
    assert sorted(rows) == sorted(ALL), log[-3000:]
    for board in gone:
        row = rows[board]
        assert row["verdict"] == "ERROR" and row["infrastructure"], row
        assert f"place {board}" in row["reason"] and "exporter-b" in row["reason"] and "went away" in row["reason"]
    for board in set(ALL) - set(gone):
        assert not rows[board]["infrastructure"], rows[board]
        assert rows[board]["verdict"] in (("FAIL",) if board == FAULTY else ("PASS", "WARN"))
        assert rows[board]["steps"] and json.loads((out / board / "report.json").read_text())["exit_code"] is not None
    assert doc["verdict"] == "ERROR" and code == 3, log[-3000:]
    fleet_junit = ET.parse(out / "fleet-junit.xml").getroot()
    assert int(fleet_junit.get("errors", "0")) >= 2


def test_tags_that_match_no_place_are_a_usage_error(tmp_path: Path) -> None:
    """Without a place to run on, the command says which tags matched nothing (exit 2, no traceback)."""
    if _missing():
        pytest.skip(_missing() or "")
    coordinator = labgrid_bin("labgrid-coordinator")
    assert coordinator is not None
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with lab(tmp_path / "lab", env) as the:
        result = subprocess.run(
            [*_LAB_RUN, "--tags", "board=nothing", "--out", str(tmp_path / "o"), "--", "device", "check"],
            capture_output=True,
            text=True,
            env=the.env,
            timeout=HANG_BOUND_S,
            check=False,
        )
    assert result.returncode == 2, result.stderr
    assert "--tags board=nothing: no place" in result.stderr and "Traceback" not in result.stderr


def test_a_place_allocated_while_its_exporter_is_offline_is_an_infrastructure_error(the_lab: Lab) -> None:
    """labgrid#1477: the coordinator allocates (and locks) a place whose exporter is offline; its board is an
    infrastructure ERROR naming the place, the other boards run (exporter-b was killed by the test above)."""
    assert the_lab.exporters["exporter-b"].poll() is not None
    out = the_lab.root.parent / "exporter-offline"
    code = _wait(_lab_run(the_lab, out, "device", "check"), out)
    rows = _rows(_fleet(out))
    assert sorted(rows) == sorted(ALL)
    for board in ("lab-b2", "lab-b3"):
        assert rows[board]["infrastructure"] and f"place {board}" in rows[board]["reason"], rows[board]
        assert "allocated but its exporter is offline" in rows[board]["reason"]
    assert rows[FAULTY]["verdict"] == "FAIL" and rows["lab-b0"]["verdict"] in ("PASS", "WARN") and code == 3
    assert the_lab.client("reservations").stdout.strip() == ""


def test_a_lab_ci_test_gets_the_board_through_lg_env(tmp_path: Path) -> None:
    """``def test_bringup(calctl_board)`` in a lab's own suite: labgrid's plugin reads ``--lg-env`` and the
    fixture of calctl.lab.pytest_plugin hands the target's CalctlDriver to the test (docs/lab.md)."""
    try:
        import labgrid  # noqa: F401
    except ImportError:
        pytest.skip("labgrid is not installed (the test extra installs it: pip install -e '.[test]')")
    suite = tmp_path / "lab-ci"
    suite.mkdir()
    (suite / "env.yaml").write_text(
        "targets:\n  main:\n    resources:\n      CalculetBoard:\n        board_id: ci-b0\n        mock_seed: 9\n"
        f"        calctl: {calctl_command()}\n    drivers:\n      CalctlDriver: {{}}\n"
        "imports:\n  - calctl.lab.driver\n"
    )
    (suite / "conftest.py").write_text('pytest_plugins = ["calctl.lab.pytest_plugin"]\n')
    (suite / "test_board.py").write_text(
        "def test_check(calctl_board):\n"
        "    run = calctl_board.run('device', 'check')\n"
        "    assert run.infra_error is None and run.verdict in ('PASS', 'WARN'), run.document()\n"
        "    assert (run.out_dir / 'report.json').is_file() and (run.out_dir / 'junit.xml').is_file()\n"
        "    assert run.board.board_id == 'ci-b0'\n"
    )
    reports = tmp_path / "reports"
    result = subprocess.run(
        [*_PYTEST, "--lg-env", "env.yaml", "--calctl-lab-reports", str(reports), f"--junitxml={tmp_path / 'ci.xml'}"],
        cwd=suite,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=HANG_BOUND_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout
    (run_dir,) = reports.iterdir()
    assert json.loads((run_dir / "report.json").read_text())["command"] == "device check"


def test_a_lab_ci_test_gets_a_locked_place_through_lg_env(the_lab: Lab, tmp_path: Path) -> None:
    """The lab CI flow of docs/lab.md: the place is locked with labgrid-client, the environment's main target is
    that RemotePlace, and the fixture's driver runs the command on the board's host over SSH (lab-b4)."""
    suite = tmp_path / "lab-ci"
    suite.mkdir()
    (suite / "env.yaml").write_text(
        "targets:\n  main:\n    resources:\n      RemotePlace:\n        name: lab-b4\n"
        "    drivers:\n      CalctlDriver: {}\nimports:\n  - calctl.lab.driver\n"
    )
    (suite / "conftest.py").write_text('pytest_plugins = ["calctl.lab.pytest_plugin"]\n')
    (suite / "test_board.py").write_text(
        "def test_check(calctl_board):\n"
        "    run = calctl_board.run('device', 'check')\n"
        "    assert run.infra_error is None and run.verdict in ('PASS', 'WARN'), run.document()\n"
        "    assert run.board.board_id == 'lab-b4' and run.board.host == 'calctl-lab-sshd'\n"
    )
    reports = tmp_path / "reports"
    the_lab.client("-p", "lab-b4", "acquire")
    try:
        result = subprocess.run(
            [*_PYTEST, "--lg-env", "env.yaml", "--calctl-lab-reports", str(reports)],
            cwd=suite,
            capture_output=True,
            text=True,
            env=the_lab.env,
            timeout=HANG_BOUND_S,
            check=False,
        )
    finally:
        the_lab.client("-p", "lab-b4", "release")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = reports.iterdir()
    assert json.loads((run_dir / "report.json").read_text())["command"] == "device check"
    assert not list((the_lab.root.parent / "remote-work").iterdir())
