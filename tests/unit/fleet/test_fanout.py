"""The fan-out (calctl.fleet.fanout): a child that cannot start or dies is an infrastructure ERROR row naming the
host and why, --parallel bounds how many run at once, and each child's lines reach the caller with its board."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from calctl.fleet import fanout
from calctl.fleet.boards import Board
from calctl.fleet.fanout import ChildRun, run_boards

RUN = ChildRun(args=["device", "check", "--format", "json"], report_is_dir=False, command="device check")


def _script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _fake(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """Each board's child runs ``code`` (with the board's directory as argv[1]) instead of calctl."""
    monkeypatch.setattr(fanout, "child_argv", lambda run, board, d: [*_script(code), str(d)])


REPORT = (
    "import json, os, sys, time\n"
    "d = sys.argv[1]\n"
    "t0 = time.time(); print('working on', os.environ['CALCTL_BOARD_ID'], file=sys.stderr, flush=True)\n"
    "time.sleep(0.3)\n"
    "json.dump({'command': 'device check', 'verdict': 'PASS', 'device': 'mock', 't0': t0, 't1': time.time()},\n"
    "          open(os.path.join(d, 'report.json'), 'w'))\n"
)


def test_parallel_bounds_the_children_and_their_lines_name_the_board(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake(monkeypatch, REPORT)
    lines: list[tuple[str, str]] = []
    boards = [Board("b0", seed=1), Board("b1", seed=2), Board("b2", seed=3)]
    report = run_boards(RUN, boards, tmp_path, parallel=1, on_line=lambda b, line: lines.append((b, line)))
    assert report.verdict == "PASS" and [b.board_id for b in report.boards] == ["b0", "b1", "b2"]
    spans = sorted(
        (doc["t0"], doc["t1"])
        for doc in (json.loads((tmp_path / b / "report.json").read_text()) for b in ("b0", "b1", "b2"))
    )
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans  # one at a time
    assert sorted(lines) == [("b0", "working on b0"), ("b1", "working on b1"), ("b2", "working on b2")]
    assert json.loads((tmp_path / "b1" / "board.json").read_text())["seed"] == 2
    assert (tmp_path / "b1" / "console.log").read_text() == "working on b1\n"


def test_a_child_killed_by_a_signal_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake(monkeypatch, "import os, signal, sys\nprint('about to go', file=sys.stderr, flush=True)\n"
                       "os.kill(os.getpid(), signal.SIGKILL)\n")  # fmt: skip
    report = run_boards(RUN, [Board("b0")], tmp_path)
    row = report.boards[0]
    assert row.verdict == "ERROR" and row.infrastructure and report.exit_code == 3
    assert "died of SIGKILL" in row.reason and "about to go" in row.reason and row.place


def test_a_child_that_cannot_start_is_an_infrastructure_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fanout, "child_argv", lambda run, board, d: [str(tmp_path / "no-such-python")])
    report = run_boards(RUN, [Board("b0"), Board("b1")], tmp_path)
    assert [r.verdict for r in report.boards] == ["ERROR", "ERROR"]
    assert all(r.infrastructure and "could not start" in r.reason for r in report.boards)


def test_the_child_gets_the_boards_environment_and_this_calctl_first_on_its_path(tmp_path: Path) -> None:
    import calctl

    env = fanout.child_environment(Board("b7", seed=4), {"PYTHONPATH": "/elsewhere", "CALCTL_BOARD_ID": "old"})
    assert env["CALCTL_BOARD_ID"] == "b7" and env["CALCTL_MOCK_SEED"] == "4"
    assert env["PYTHONPATH"].split(":") == [str(Path(calctl.__file__).resolve().parent.parent), "/elsewhere"]
    argv = fanout.child_argv(RUN, Board("b7", fault_plan=Path("/p.yaml")), tmp_path / "b7")
    assert argv[1:] == ["-m", "calctl", *RUN.args, "--device", "mock", "--fault-plan", "/p.yaml", "--report",
                        str(tmp_path / "b7" / "report.json")]  # fmt: skip
    traced = ChildRun(args=["run-golden"], report_is_dir=False, command="run-golden", files={"--trace": "t.json"})
    argv = fanout.child_argv(traced, Board("b7"), tmp_path / "b7")
    assert argv[-4:] == ["--trace", str(tmp_path / "b7" / "t.json"), "--report", str(tmp_path / "b7" / "report.json")]
