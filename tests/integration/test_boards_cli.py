"""Several boards of one host (docs/boards.md): ``device list``, ``--boards`` on a device command (one child calctl
per board, their report directories, one fleet report), an infrastructure ERROR for a child that never reported,
SIGINT forwarded to every child with the partial fleet report written, and ``report compare`` on the boards'
reports (docs/report-compare.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import Cli, assert_no_traceback
from tests.waiting import wait_until

SLOW_CHIP_1 = "schema: calctl-fault-plan/v1\nfaults:\n  - {kind: slow_chip_transfer, chip: 1, probability: 1}\n"


def _boards(tmp_path: Path, *entries: str) -> Path:
    (tmp_path / "slow.yaml").write_text(SLOW_CHIP_1)
    path = tmp_path / "boards.yaml"
    path.write_text("boards:\n" + "".join(f"  - {e}\n" for e in entries))
    return path


THREE = ("{id: rack1-b0, seed: 1}", "{id: rack1-b1, seed: 2}", "{id: rack1-b2, seed: 3, fault_plan: slow.yaml}")


def test_device_list_shows_the_boards_of_a_boards_file(cli: Cli, tmp_path: Path) -> None:
    boards = _boards(tmp_path, *THREE)
    r = cli("device", "list", "--boards-file", boards, "--format", "json")
    assert r.code == 0, r.err
    assert [(b["id"], b["seed"]) for b in r.json["boards"]] == [("rack1-b0", 1), ("rack1-b1", 2), ("rack1-b2", 3)]
    assert r.json["boards"][2]["fault_plan"] == str(tmp_path / "slow.yaml") and r.json["opened"] is False
    r = cli("device", "list", "--boards-file", boards)
    assert r.code == 0 and "rack1-b2" in r.out and "3 board(s) from boards file" in r.out


def test_a_bad_boards_file_is_exit_2_naming_the_file_the_field_and_the_value(cli: Cli, tmp_path: Path) -> None:
    boards = _boards(tmp_path, "{id: rack1-b0, kind: fpga}")
    for args in (("device", "list"), ("device", "check", "--boards", "all")):
        r = cli(*args, "--boards-file", boards)
        assert_no_traceback(r)
        assert r.code == 2 and "boards.yaml" in r.err and "boards[0].kind" in r.err and "'fpga'" in r.err, r.err
    r = cli("device", "check", "--boards", "rack1-b9", "--boards-file", _boards(tmp_path, "{id: rack1-b0}"))
    assert r.code == 2 and "no board 'rack1-b9'" in r.err and "rack1-b0" in r.err


def test_selftest_on_three_boards_one_fleet_report_and_compare_names_the_slowed_chip(cli: Cli, tmp_path: Path) -> None:
    boards = _boards(tmp_path, *THREE)
    out = tmp_path / "fleet"
    r = cli("device", "selftest", "--boards", "all", "--boards-file", boards, "--repeats", "3", "--report", out,
            "--format", "json")  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 0, r.err  # no profile: every row NOT JUDGED, exit 0
    doc = r.json
    assert doc["schema"] == "calctl-fleet-report/v1" and doc["command"] == "device selftest"
    rows = {b["board_id"]: b for b in doc["boards"]}
    assert set(rows) == {"rack1-b0", "rack1-b1", "rack1-b2"}
    for board_id, row in rows.items():
        assert row["report_dir"] == board_id and (out / board_id / "report.json").is_file()
        assert row["device_label"] == "mock" and not row["infrastructure"]
        assert row["steps"]["h2d chip 0"] == "NOT JUDGED"
    assert rows["rack1-b2"]["seed"] == 3 and rows["rack1-b2"]["fault_plan"].endswith("slow.yaml")
    assert json.loads((out / "fleet-report.json").read_text())["boards"] == doc["boards"]
    assert "rack1-b2" in (out / "fleet-report.html").read_text()
    assert (out / "rack1-b1" / "console.log").is_file() and (out / "rack1-b1" / "board.json").is_file()

    # the same board again: no figure beyond the runs' intervals
    again = tmp_path / "again"
    r = cli("device", "selftest", "--boards", "rack1-b0", "--boards-file", boards, "--repeats", "3", "--report", again)
    assert r.code == 0, r.err
    r = cli("report", "compare", out / "rack1-b0", again / "rack1-b0", "--format", "json")
    assert r.code == 0 and r.json["beyond_interval"] == [], r.out
    # the board with a slowed chip: its chip-1 rates are named
    r = cli("report", "compare", out / "rack1-b0", out / "rack1-b2", "--format", "json")
    assert r.code == 1, r.out
    assert sorted(r.json["beyond_interval"]) == ["rows/d2h chip 1/figure_gbps", "rows/h2d chip 1/figure_gbps"]
    r = cli("report", "compare", out / "rack1-b0", out / "rack1-b2")
    assert r.code == 1 and "beyond the runs' intervals: rows/h2d chip 1/figure_gbps" in r.out


def test_a_board_whose_child_never_reports_is_an_infrastructure_error_not_a_fail(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("schema: calctl-fault-plan/v1\nfaults: [{kind: no_such_fault}]\n")
    boards = _boards(tmp_path, "{id: good, seed: 1}", "{id: broken, fault_plan: broken.yaml}")
    out = tmp_path / "fleet"
    r = cli("device", "check", "--boards", "all", "--boards-file", boards, "--report", out, "--format", "json")
    assert_no_traceback(r)
    assert r.code == 3, r.out  # ERROR: the worst row
    rows = {b["board_id"]: b for b in r.json["boards"]}
    assert rows["good"]["verdict"] == "PASS" and not rows["good"]["infrastructure"]
    broken = rows["broken"]
    assert broken["verdict"] == "ERROR" and broken["infrastructure"] is True
    assert "exited 2 without a report" in broken["reason"] and "no_such_fault" in broken["reason"]
    assert broken["place"] and r.json["boards"][0]["board_id"] == "broken"  # the failing board first


def test_accept_long_on_two_boards_gives_each_board_the_level_and_its_burn_in(cli: Cli, tmp_path: Path) -> None:
    """``--boards`` passes ``--level long`` and ``--burn-in-minutes`` to every board unchanged: each runs its
    burn-in, and the board whose fan failed is the fleet's FAIL naming the chip and the limit."""
    from tests.conftest import FIXTURE_PACKAGES, TEST_PUB

    (tmp_path / "fan.yaml").write_text(
        "schema: calctl-fault-plan/v1\nfaults:\n  - {kind: fan_failed, job: 1, chip: 0, magnitude: 20}\n"
    )
    boards = _boards(tmp_path, "{id: cool, seed: 1}", "{id: hot, seed: 2, fault_plan: fan.yaml}")
    out = tmp_path / "fleet"
    r = cli(
        "accept", FIXTURE_PACKAGES / "combined", "--trusted-key", TEST_PUB, "--level", "long", "--burn-in-minutes",
        "0.05", "--only", "G0", "--boards", "all", "--boards-file", boards, "--report", out, "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, r.err[-2000:]
    rows = {b["board_id"]: b for b in r.json["boards"]}
    assert rows["hot"]["verdict"] == "FAIL" and "chip 0 temperature" in rows["hot"]["reason"]
    for board_id in ("cool", "hot"):
        doc = json.loads((out / board_id / "report.json").read_text())
        assert doc["level"] == "long" and doc["level_settings"]["burnin_minutes"] == 0.05
        assert (out / board_id / "burn-in.json").is_file()
    cool = json.loads((out / "cool" / "report.json").read_text())
    assert cool["board"]["burn-in"]["verdict"] in ("PASS", "WARN") and rows["cool"]["verdict"] != "FAIL"
    hot = json.loads((out / "hot" / "report.json").read_text())
    assert "over the limit 90 C" in hot["error"]


def test_report_merge_of_the_boards_directories(cli: Cli, tmp_path: Path) -> None:
    boards = _boards(tmp_path, "{id: b0, seed: 1}", "{id: b1, seed: 2}")
    out = tmp_path / "fleet"
    r = cli("device", "check", "--boards", "all", "--boards-file", boards, "--report", out)
    assert r.code == 0, r.err
    assert "[b1]   PASS known answer chip 1" in r.err  # progress lines, prefixed with the board
    assert "b0" in r.out and "fleet-report.html" in r.out and "verdict PASS" in r.out
    merged = tmp_path / "merged"
    r = cli("report", "merge", out / "b0", out / "b1", "--out", merged, "--format", "json")
    assert r.code == 0 and [b["report_dir"] for b in r.json["boards"]] == ["../fleet/b0", "../fleet/b1"]
    assert (merged / "fleet-report.html").is_file()
    r = cli("report", "merge", tmp_path / "nope")
    assert r.code == 2 and "not a report directory" in r.err


def test_sigint_reaches_every_board_and_the_partial_fleet_report_is_written(tmp_path: Path) -> None:
    boards = _boards(tmp_path, "{id: s0, seed: 1}", "{id: s1, seed: 2}")
    out = tmp_path / "fleet"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "calctl",
            "soak",
            "--cycles",
            "1000",
            "--traffic-seconds",
            "0.2",
            "--checkpoint-interval",
            "0.2",
            "--boards",
            "all",
            "--boards-file",
            str(boards),
            "--report",
            str(out),
            "--format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:

        def cycling() -> bool:
            logs = [out / b / "console.log" for b in ("s0", "s1")]
            return all(p.exists() and b"soak 1/1000 cycles" in p.read_bytes() for p in logs)

        wait_until(
            cycling,
            what="both boards' soaks to finish a cycle",
            timeout=180,
            detail=lambda: sorted(str(p.relative_to(out)) for p in out.glob("*/*")) if out.exists() else "no fleet",
        )
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr.decode()
    doc = json.loads(stdout)
    assert doc["verdict"] == "INTERRUPTED" and doc["interrupted"] == "SIGINT"
    for row in doc["boards"]:
        assert row["verdict"] == "INTERRUPTED" and not row["infrastructure"], row  # each wrote its partial report
    assert json.loads((out / "fleet-report.json").read_text())["verdict"] == "INTERRUPTED"
