"""``calctl device check`` and ``calctl device reset`` on the mock: ready only on known answers, a reset proven.

Every not-ready case names its chip and why; every fault of a reset (docs/runtime.md §4: ``reset_failure``,
``reset_chip_lost``, ``reset_takes_other_chip``) exits non-zero naming the chip; the healthy board passes
beside a CPU-bound process per core (the known-answer jobs are judged on their answers, not on time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Cli, CliResult, assert_no_traceback
from tests.cpu_load import busy_host


def _plan(tmp_path: Path, *faults: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text("schema: calctl-fault-plan/v1\nfaults:\n" + "".join(f"  - {f}\n" for f in faults))
    return path


def _run(cli: Cli, *args: object) -> CliResult:
    r = cli("device", *args, "--format", "json")
    assert_no_traceback(r)
    return r


def _chips(doc: dict) -> dict[int, dict]:
    return {c["chip"]: c for c in doc["chips"]}


def _steps(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["steps"]}


def test_a_healthy_mock_is_ready_on_a_known_answer_from_each_chip(cli: Cli) -> None:
    r = _run(cli, "check")
    assert r.code == 0, r.err[-2000:]
    doc = r.json
    assert doc["verdict"] == "PASS" and doc["ready"] is True and doc["error"] is None
    assert doc["device_label"] == "mock" and doc["mock_result"] is True and "MOCK RESULT" in doc["note"]
    chips = _chips(doc)
    assert sorted(chips) == [0, 1]
    assert chips[0]["known_answer"]["model"] == "model-a" and chips[1]["known_answer"]["model"] == "model-b"
    assert all(c["ready"] and c["known_answer"]["status"] == "PASS" and c["health"] == "ok" for c in chips.values())
    steps = _steps(doc)
    for name in (
        "versions",
        "topology",
        "health chip 0",
        "health chip 1",
        "known answer chip 0",
        "known answer chip 1",
    ):
        assert steps[name]["status"] == "PASS", steps[name]
    assert "16/16 tokens exact" in steps["known answer chip 1"]["detail"]
    assert steps["release"]["status"] == "PASS"  # the check leaves the board unconfigured


def test_a_chip_that_answers_wrong_is_not_ready_though_its_health_says_ok(cli: Cli, tmp_path: Path) -> None:
    """The lie users complain of (a validator says Ready while the device is broken): health alone never passes."""
    plan = _plan(tmp_path, "{kind: corrupt_output, chip: 1, probability: 1}")
    r = _run(cli, "check", "--fault-plan", plan)
    assert r.code == 1
    doc = r.json
    chips = _chips(doc)
    assert doc["verdict"] == "FAIL" and doc["ready"] is False
    assert chips[1]["health"] == "ok" and not chips[1]["ready"] and "wrong answer" in chips[1]["why"]
    assert chips[0]["ready"]
    assert doc["error"].startswith("chip 1: wrong answer") and "model-b" in doc["error"]


def test_a_chip_that_faults_on_its_job_is_not_ready(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: ccu_exception, chip: 0, job: 1}")
    r = _run(cli, "check", "--fault-plan", plan)
    assert r.code == 1
    chips = _chips(r.json)
    assert not chips[0]["ready"] and "CCU" in chips[0]["why"].upper()
    assert chips[1]["ready"]
    assert "chip 0:" in r.json["error"]


def test_a_hung_chip_is_not_ready_within_the_step_timeout(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: wait_timeout, chip: 1, job: 1}")
    r = _run(cli, "check", "--fault-plan", plan, "--step-timeout", "0.5")
    assert r.code == 1
    chips = _chips(r.json)
    assert not chips[1]["ready"] and "did not finish within 0.5 s" in chips[1]["why"]
    assert chips[0]["ready"]


def test_no_device_is_exit_3_with_a_report(cli: Cli, tmp_path: Path) -> None:
    r = _run(cli, "check", "--device", "calrt", "--calrt-lib", tmp_path / "absent.so")
    assert r.code == 3
    assert r.json["verdict"] == "ERROR" and "absent.so" in r.json["error"]
    assert r.json["ready"] is False


def test_the_table_names_the_board_and_the_chip_that_is_not_ready(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: corrupt_output, chip: 0, probability: 1}")
    r = cli("device", "check", "--fault-plan", plan)
    assert_no_traceback(r)
    assert r.code == 1
    assert "board mock0 on mock (mock): NOT READY" in r.out and "verdict FAIL: chip 0: wrong answer" in r.out
    assert "MOCK RESULT" in r.out


def test_junit_has_one_testcase_per_step_and_the_failing_chip_fails(cli: Cli, tmp_path: Path) -> None:
    """A CI prologue's report: the chip that is not ready is a failed testcase naming why."""
    import xml.etree.ElementTree as ET

    plan = _plan(tmp_path, "{kind: corrupt_output, chip: 1, probability: 1}")
    r = cli("device", "check", "--fault-plan", plan, "--format", "junit")
    assert r.code == 1
    cases = {c.get("name"): c for c in ET.fromstring(r.out).iter("testcase")}
    assert cases["known answer chip 0"].find("failure") is None
    failure = cases["known answer chip 1"].find("failure")
    assert failure is not None and "wrong answer" in str(failure.get("message"))


# ---------------------------------------------------------------------------
# reset


@pytest.mark.parametrize("args", [("--scope", "board"), ("--scope", "chip", "--chip", "1")])
def test_a_reset_that_brings_the_board_back_is_proven(cli: Cli, args: tuple[str, ...]) -> None:
    r = _run(cli, "reset", *args)
    assert r.code == 0, r.err[-2000:]
    doc = r.json
    steps = _steps(doc)
    reset_step = "board reset" if args[1] == "board" else "chip 1 reset"
    assert steps[reset_step]["status"] == "PASS"
    assert steps["known answer chip 0"]["status"] == steps["known answer chip 1"]["status"] == "PASS"
    assert doc["reset"] == {"scope": args[1], "chip": 1 if args[1] == "chip" else None}


def test_a_reset_that_fails_exits_1_naming_the_chips_it_covered(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: reset_failure, reset: 1}")
    r = _run(cli, "reset", "--scope", "chip", "--chip", "0", "--fault-plan", plan)
    assert r.code == 1
    doc = r.json
    assert _steps(doc)["chip 0 reset"]["status"] == "FAIL"
    assert doc["error"].startswith("chip 0: the chip 0 reset failed") and "reset_failure" in doc["error"]
    assert _chips(doc)[1]["ready"]  # the reset never touched chip 1


def test_a_chip_that_does_not_come_back_exits_1_naming_it(cli: Cli, tmp_path: Path) -> None:
    """tenstorrent/tt-umd#2316: the reset returns OK and the device is gone; the proof catches it."""
    plan = _plan(tmp_path, "{kind: reset_chip_lost, reset: 1, chip: 1}")
    r = _run(cli, "reset", "--scope", "board", "--fault-plan", plan)
    assert r.code == 1
    doc = r.json
    steps = _steps(doc)
    assert steps["board reset"]["status"] == "PASS"  # the runtime said OK ...
    assert steps["health chip 1"]["status"] == "FAIL"  # ... and chip 1 did not come back
    assert doc["error"].startswith("chip 1: faulted: did not come back after the board reset")
    assert steps["known answer chip 0"]["status"] == "SKIP"


def test_a_chip_reset_that_takes_the_other_chip_down_exits_1_naming_that_chip(cli: Cli, tmp_path: Path) -> None:
    """Xilinx/video-sdk#8: a reset leaves another chip unavailable; the proof covers both chips."""
    plan = _plan(tmp_path, "{kind: reset_takes_other_chip, reset: 1}")
    r = _run(cli, "reset", "--scope", "chip", "--chip", "0", "--fault-plan", plan)
    assert r.code == 1
    doc = r.json
    chips = _chips(doc)
    assert chips[1]["health"] == "faulted" and "went down with the chip 0 reset" in chips[1]["why"]
    assert doc["error"].startswith("chip 1: faulted")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--scope", "chip"), "--scope chip needs --chip N"),
        (("--scope", "board", "--chip", "1"), "--chip 1 applies to --scope chip only"),
        (("--scope", "chip", "--chip", "2"), "--chip 2: the board has chips 0..1"),
        (("--scope", "socket"), "socket"),
    ],
)
def test_a_bad_scope_or_chip_is_a_usage_error(cli: Cli, args: tuple[str, ...], words: str) -> None:
    r = cli("device", "reset", *args)
    assert_no_traceback(r)
    assert r.code == 2 and words in r.err, r.err


def test_a_reset_is_refused_while_another_process_holds_the_board(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is taken before the shim is even loaded: nothing is reset under the holder's jobs."""
    monkeypatch.setenv("CALCTL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("CALRT_DEVICE", "0000:3b:00.0")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from calctl.runtime import board_lock\nl = board_lock.acquire()\nprint('held', flush=True)\ninput()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        # The library does not exist: had the lock not refused first, this would be "cannot load".
        r = _run(cli, "reset", "--device", "calrt", "--calrt-lib", tmp_path / "absent.so")
        check = _run(cli, "check", "--device", "calrt", "--calrt-lib", tmp_path / "absent.so")
    finally:
        holder.communicate("\n", timeout=30)
    assert r.code == 3
    assert r.json["verdict"] == "ERROR"
    assert r.json["error"].startswith("refused, nothing was reset: board '0000:3b:00.0' is already opened")
    assert f"pid {holder.pid}" in r.json["error"]
    assert [s["name"] for s in r.json["steps"]][:1] == ["open device"]
    assert "board reset" not in _steps(r.json)
    # The check cannot look at a board another process holds: no device for it (exit 3), never "ready".
    assert check.code == 3 and check.json["ready"] is False and f"pid {holder.pid}" in check.json["error"]


def test_a_cache_the_known_answers_cannot_be_built_in_is_a_configuration_error(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALCTL_CACHE_DIR", "/proc/calctl-no-such-cache")
    r = cli("device", "check")
    assert_no_traceback(r)
    assert r.code == 2 and "the known-answer package cannot be built in the cache /proc/calctl-no-such-cache" in r.err


def test_the_healthy_board_is_ready_beside_a_busy_host(cli: Cli) -> None:
    with busy_host():
        r = _run(cli, "check")
        r2 = _run(cli, "reset", "--scope", "chip", "--chip", "0")
    assert r.code == 0 and r.json["ready"], r.json.get("error")
    assert r2.code == 0, r2.json.get("error")
