"""calctl.lab.board: one command for one board, here or behind a command prefix (no labgrid needed; subprocesses).

A stand-in calctl (a short Python script) writes what the real one writes: progress lines on stderr, JUnit or
JSON on stdout, ``report.json`` where ``--report`` says. ``sh -c`` as the prefix plays the SSH connection: the
command line is handed over as one string and the report directory comes back as a tar stream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from calctl.errors import UsageError
from calctl.lab.board import (
    BoardRun,
    LabBoard,
    LabCommand,
    Stopper,
    board_from_params,
    fetch_dir,
    run_on_board,
    shell_command,
)

FAKE = r"""
import json, os, signal, sys, time
args = sys.argv[1:]
report = args[args.index("--report") + 1]
fmt = args[args.index("--format") + 1]
path = report if report.endswith(".json") else os.path.join(report, "report.json")
os.makedirs(os.path.dirname(path), exist_ok=True)

def write(verdict, code):
    doc = {"command": args[0], "verdict": verdict, "exit_code": code,
           "board": os.environ.get("CALCTL_BOARD_ID"), "seed": os.environ.get("CALCTL_MOCK_SEED"), "args": args}
    open(path, "w").write(json.dumps(doc))
    return doc

def on_term(signum, frame):  # calctl's own SIGTERM: the run ends INTERRUPTED with its report written
    write("INTERRUPTED", 130)
    sys.exit(130)

signal.signal(signal.SIGTERM, on_term)
print("plan: fake " + " ".join(args), file=sys.stderr, flush=True)
if os.environ.get("FAKE_SLEEP"):
    time.sleep(float(os.environ["FAKE_SLEEP"]))
verdict = "FAIL" if "--fault-plan" in args else "PASS"
doc = write(verdict, 0 if verdict == "PASS" else 1)
if not report.endswith(".json"):
    os.makedirs(os.path.join(report, "soak"), exist_ok=True)
    open(os.path.join(report, "soak", "events.ndjson"), "w").write("{}\n")
print("<testsuites/>" if fmt == "junit" else json.dumps(doc))
print("  PASS last step", file=sys.stderr, flush=True)
sys.exit(doc["exit_code"])
"""


@pytest.fixture
def fake(tmp_path: Path) -> str:
    script = tmp_path / "fake_calctl.py"
    script.write_text(FAKE)
    return f"{sys.executable} {script}"


def test_a_board_is_refused_with_the_field_that_is_wrong() -> None:
    with pytest.raises(UsageError, match="device 'gpu': expected mock or calrt"):
        LabBoard("b0", device="gpu")
    with pytest.raises(UsageError, match="CALCTL_BOARD_ID"):
        LabBoard("b 0")
    with pytest.raises(UsageError, match="mock_seed -1"):
        LabBoard("b0", mock_seed=-1)
    with pytest.raises(UsageError, match="for the mock device, not calrt"):
        LabBoard("b0", device="calrt", mock_seed=3)
    with pytest.raises(UsageError, match="host 'a b'"):
        LabBoard("b0", host="a b")
    with pytest.raises(UsageError, match=r"unknown field\(s\) \['serial'\]"):
        board_from_params({"board_id": "b0", "serial": "x"})
    with pytest.raises(UsageError, match="mock_seed '7'"):
        board_from_params({"board_id": "b0", "mock_seed": "7"})


def test_the_command_is_one_the_lab_knows_and_the_lab_owns_report_and_format() -> None:
    assert LabCommand.parse(["device", "check"]).name == "device check"
    assert LabCommand.parse(["bringup", "--level", "quick"]).report == "dir"
    with pytest.raises(UsageError, match="command 'serve'"):
        LabCommand.parse(["serve"])
    with pytest.raises(UsageError, match="--report is set by the lab"):
        LabCommand.parse(["bringup", "--report", "x"])
    with pytest.raises(UsageError, match="--format is set by the lab"):
        LabCommand.parse(["device", "check", "--format=json"])


def test_the_shell_line_carries_the_boards_environment_quoted() -> None:
    board = LabBoard("rack1-b3", mock_seed=7, fault_plan="/plans/a plan.yaml", calrt_library="/lib/x;rm -rf /")
    line = shell_command(board, LabCommand.parse(["device", "check"]), "'/tmp/r'")
    argv = ["sh", "-c", line.replace("mkdir -p", "true").replace("exec env", "exec printf '%s\\n'")]
    words = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    assert "CALCTL_BOARD_ID=rack1-b3" in words and "CALCTL_MOCK_SEED=7" in words
    assert "CALRT_LIBRARY=/lib/x;rm -rf /" in words  # one word: quoted, never run
    assert words[words.index("--fault-plan") + 1] == "/plans/a plan.yaml"
    assert words[-2:] == ["--report", "/tmp/r/report.json"] and words[words.index("--format") + 1] == "junit"


def test_a_local_run_writes_into_the_directory_and_streams_progress(tmp_path: Path, fake: str) -> None:
    lines: list[str] = []
    run = run_on_board(
        LabBoard("b0", mock_seed=5, calctl=fake), LabCommand.parse(["bringup"]), tmp_path / "b0", on_line=lines.append
    )
    assert run.infra_error is None and run.verdict == "PASS" and run.exit_code == 0
    doc = json.loads((tmp_path / "b0" / "report.json").read_text())
    assert doc["board"] == "b0" and doc["seed"] == "5"
    assert lines[0].startswith("plan: fake bringup") and lines[-1] == "  PASS last step"
    assert (tmp_path / "b0" / "junit.xml").read_text().strip() == "<testsuites/>"
    ident = json.loads((tmp_path / "b0" / "board.json").read_text())
    assert ident["id"] == "b0" and ident["seed"] == 5
    assert json.loads((tmp_path / "b0" / "lab-run.json").read_text())["verdict"] == "PASS"


def test_a_prefixed_run_fetches_the_report_directory_and_removes_it_there(tmp_path: Path, fake: str) -> None:
    work = tmp_path / "remote"
    work.mkdir()
    board = LabBoard("b1", calctl=fake, fault_plan="/p.yaml", host="h", workdir=str(work))
    run = run_on_board(board, LabCommand.parse(["soak"]), tmp_path / "b1", prefix=["sh", "-c"])
    assert run.infra_error is None and run.verdict == "FAIL" and run.exit_code == 1
    assert (tmp_path / "b1" / "soak" / "events.ndjson").is_file()
    assert json.loads((tmp_path / "b1" / "stdout.json").read_text())["verdict"] == "FAIL"
    assert list(work.iterdir()) == []


def test_a_connection_that_fails_is_an_infrastructure_error_not_a_verdict(tmp_path: Path, fake: str) -> None:
    board = LabBoard("b2", calctl=fake, host="h")
    run = run_on_board(board, LabCommand.parse(["device", "check"]), tmp_path / "b2", prefix=["sh", "-c", "exit 255"])
    assert run.verdict is None and run.infra_error is not None
    assert run.infra_error.startswith("the SSH connection failed or dropped (exit 255)")
    missing = run_on_board(
        LabBoard("b3", calctl="/nonexistent/calctl"), LabCommand.parse(["device", "check"]), tmp_path / "b3"
    )
    assert missing.infra_error is not None and "calctl was not found (exit 127)" in missing.infra_error
    refused = run_on_board(
        LabBoard("b5", calctl=f"{sys.executable} -m calctl"),
        LabCommand.parse(["device", "check", "--step-timeout", "-1"]),
        tmp_path / "b5",
    )
    assert refused.infra_error is not None and refused.infra_error.startswith("calctl refused the command (exit 2")
    assert "--step-timeout" in refused.infra_error


@pytest.mark.parametrize("prefixed", [False, True], ids=["here", "behind-a-prefix"])
def test_a_stopped_run_says_why_and_keeps_the_commands_report(
    tmp_path: Path, fake: str, monkeypatch: pytest.MonkeyPatch, prefixed: bool
) -> None:
    """Stopped (its exporter went away): the command gets SIGTERM, here through its process group, behind a
    prefix through a second command naming its pid; either way it writes its INTERRUPTED report, which comes
    back, and the run is the infrastructure's error."""
    monkeypatch.setenv("FAKE_SLEEP", "120")
    work = tmp_path / "remote"
    work.mkdir()
    board = LabBoard("b4", calctl=fake, host="h" if prefixed else None, workdir=str(work))
    stopper = Stopper()
    started = threading.Event()
    result: list[BoardRun] = []

    def line(text: str) -> None:
        if text.startswith("plan:"):
            started.set()

    def run_it() -> None:
        result.append(
            run_on_board(
                board,
                LabCommand.parse(["bringup"]),
                tmp_path / "b4",
                prefix=["sh", "-c"] if prefixed else (),
                on_line=line,
                stopper=stopper,
            )
        )

    worker = threading.Thread(target=run_it)
    worker.start()
    assert started.wait(120)
    stopper.stop("its exporter went away")
    worker.join(120)
    (run,) = result
    assert run.infra_error == "its exporter went away" and run.exit_code == 130
    assert json.loads((tmp_path / "b4" / "report.json").read_text())["verdict"] == "INTERRUPTED"
    assert "calctl-lab: pid" not in (tmp_path / "b4" / "calctl.log").read_text()


def test_a_fetched_tree_with_a_link_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "report.json").write_text("{}")
    os.symlink("/etc/passwd", tree / "leak")
    why = fetch_dir(["sh", "-c"], str(tree), tmp_path / "out", keep_remote=True)
    assert why is not None and "refused" in why and "not a regular file" in why
    assert not (tmp_path / "out" / "leak").exists()
