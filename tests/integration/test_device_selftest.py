"""``calctl device selftest``: transfer rows on the device's clock, graded from a board profile.

Without a profile every figure is reported and NOT JUDGED; with one, a row is PASS at or above its
threshold and FAIL below it naming the figure. The mock's transfer faults (``slow_link``, ``slow_chip_transfer``)
turn their rows FAIL with the figure; a runtime without device memory access (a CalRT shim without the
optional memory calls) gets every row UNSUPPORTED, never a pass; the reference board passes through those
calls; a busy host never fails a row.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Cli, CliResult, assert_no_traceback
from tests.cpu_load import busy_host
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)

#: Thresholds under the mock's modelled link (3 GB/s a chip, 5 GB/s shared: docs/runtime.md §8).
PROFILE = """schema: calculet-board-profile/v1
board: mock two-chip board
source: the mock's transfer model
transfer:
  h2d_gbps_min: 2.5
  d2h_gbps_min: 2.5
  both_h2d_gbps_min: 4.0
  both_d2h_gbps_min: 4.0
  d2h_cv_max: 0.05
"""


def _profile(tmp_path: Path, text: str = PROFILE) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


def _plan(tmp_path: Path, *faults: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text("schema: calctl-fault-plan/v1\nfaults:\n" + "".join(f"  - {f}\n" for f in faults))
    return path


def _selftest(cli: Cli, *args: object) -> CliResult:
    r = cli("device", "selftest", *args, "--repeats", "3", "--format", "json")
    assert_no_traceback(r)
    return r


def _rows(r: CliResult) -> dict[str, dict]:
    return {row["name"]: row for row in r.json["rows"]}


ALONE = ("h2d chip 0", "d2h chip 0", "h2d chip 1", "d2h chip 1")
BOTH = ("h2d both chips", "d2h both chips")
STABILITY = ("d2h stability chip 0", "d2h stability chip 1")
MEMORY = tuple(
    f"memory chip {c} {p}"
    for c in (0, 1)
    for p in ("walking ones", "walking zeros", "address in address", "random (seed 0)")
)


def test_without_a_profile_every_figure_is_reported_and_not_judged(cli: Cli) -> None:
    r = _selftest(cli)
    assert r.code == 0
    doc = r.json
    assert doc["verdict"] == "NOT JUDGED" and doc["device_label"] == "mock" and doc["mock_result"] is True
    rows = _rows(r)
    assert set(rows) == {*ALONE, *BOTH, *STABILITY, *MEMORY, "host memcpy"}
    for name in ALONE:
        assert rows[name]["status"] == "NOT JUDGED" and "no board profile" in rows[name]["detail"]
        assert rows[name]["figure_gbps"] == pytest.approx(3.0, rel=0.02)  # the modelled chip rate, device clock
        assert [s["bytes"] for s in rows[name]["sizes"]] == doc["sizes"] and all(
            s["data_ok"] for s in rows[name]["sizes"]
        )
    assert rows["host memcpy"]["status"] == "MEASURED" and rows["host memcpy"]["figure_gbps"] > 0


def test_a_healthy_board_passes_its_profile(cli: Cli, tmp_path: Path) -> None:
    r = _selftest(cli, "--board-profile", _profile(tmp_path))
    rows = _rows(r)
    assert all(rows[n]["status"] == "PASS" for n in (*ALONE, *STABILITY)), [rows[n]["detail"] for n in ALONE]
    # Both chips at once: judged when the host issued them together for a transfer's time, else NOT JUDGED.
    assert all(rows[n]["status"] in ("PASS", "NOT JUDGED") for n in BOTH), [rows[n]["detail"] for n in BOTH]
    assert r.code == 0 and r.json["verdict"] in ("PASS", "NOT JUDGED")
    assert r.json["profile"] == {"path": str(tmp_path / "profile.yaml"), "board": "mock two-chip board"}


def test_a_slow_link_fails_every_row_with_its_figure(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: slow_link, probability: 1}")  # a quarter of the link: 1.25 GB/s
    r = _selftest(cli, "--board-profile", _profile(tmp_path), "--fault-plan", plan)
    assert r.code == 1 and r.json["verdict"] == "FAIL"
    rows = _rows(r)
    for name in ALONE:
        assert rows[name]["status"] == "FAIL"
        assert rows[name]["figure_gbps"] == pytest.approx(1.25, rel=0.02)
        assert "1.25 GB/s at 16 MiB" in rows[name]["detail"] and "below the profile's" in rows[name]["detail"]
    assert all(rows[n]["status"] in ("FAIL", "NOT JUDGED") for n in BOTH)
    assert "h2d chip 0: 1.25 GB/s" in r.json["error"]


def test_one_chip_at_half_its_bandwidth_fails_its_rows_only(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: slow_chip_transfer, chip: 1, probability: 1}")
    r = _selftest(cli, "--board-profile", _profile(tmp_path), "--fault-plan", plan)
    assert r.code == 1
    rows = _rows(r)
    for name in ("h2d chip 1", "d2h chip 1"):
        assert rows[name]["status"] == "FAIL" and rows[name]["figure_gbps"] == pytest.approx(1.5, rel=0.02)
        assert "1.50 GB/s" in rows[name]["detail"]
    assert rows["h2d chip 0"]["status"] == rows["d2h chip 0"]["status"] == "PASS"


def test_a_chip_whose_reads_slow_down_now_and_then_fails_its_stability_row(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: slow_chip_transfer, chip: 0, probability: 0.3}")
    r = _selftest(cli, "--board-profile", _profile(tmp_path), "--fault-plan", plan)
    assert r.code == 1
    rows = _rows(r)
    row = rows["d2h stability chip 0"]
    assert row["status"] == "FAIL" and row["figure_gbps"] > 0.05
    assert "slowest 1.50" in row["detail"] and "more than the profile's d2h_cv_max 5.0%" in row["detail"]
    assert rows["d2h stability chip 1"]["status"] == "PASS" and rows["d2h stability chip 1"]["figure_gbps"] < 0.01


def test_rows_are_judged_on_the_device_clock_beside_a_busy_host(cli: Cli, tmp_path: Path) -> None:
    with busy_host():
        r = _selftest(cli, "--board-profile", _profile(tmp_path))
    rows = _rows(r)
    assert all(rows[n]["status"] == "PASS" for n in ALONE), [rows[n]["detail"] for n in ALONE]
    assert not any(row["status"] == "FAIL" for row in rows.values())
    assert r.code == 0


@pytest.fixture(scope="module")
def shim_without_memory_calls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference board built without the optional calls of docs/calrt-c-abi.md §14: a vendor shim of today."""
    from calctl.runtime._native.build import build_reference

    return build_reference(tmp_path_factory.mktemp("no-mem"), defines=("-DCALRT_REF_NO_MEM",)).library


def test_a_shim_without_the_memory_calls_is_unsupported_never_passed(
    cli: Cli, tmp_path: Path, shim_without_memory_calls: Path
) -> None:
    r = _selftest(
        cli, "--device", "calrt", "--calrt-lib", shim_without_memory_calls, "--board-profile", _profile(tmp_path)
    )
    assert r.code == 0
    doc = r.json
    assert doc["verdict"] == "NOT JUDGED" and doc["device_label"] == "software model"
    rows = _rows(r)
    for name in (*ALONE, *BOTH, *STABILITY, *MEMORY):
        assert rows[name]["status"] == "UNSUPPORTED" and "C4" in rows[name]["detail"]
        assert "calrt_mem_window, calrt_write_mem, calrt_read_mem" in rows[name]["detail"]
        assert rows[name]["figure_gbps"] is None
    assert not any(row["status"] == "PASS" for row in rows.values())


def test_the_reference_board_passes_through_the_optional_calls(
    cli: Cli,
    tmp_path: Path,
    reference_board: Path,  # noqa: F811
) -> None:
    r = _selftest(
        cli, "--device", "calrt", "--calrt-lib", reference_board, "--board-profile", _profile(tmp_path), "--seed", "7"
    )
    doc = r.json
    assert doc["device_label"] == "software model" and doc["device_options"]["calrt_lib"] == str(reference_board)
    rows = _rows(r)
    assert all(rows[n]["status"] == "PASS" for n in (*ALONE, *STABILITY, *MEMORY[:3], *MEMORY[4:7])), [
        rows[n]["detail"] for n in ALONE
    ]
    assert rows["h2d chip 1"]["figure_gbps"] == pytest.approx(3.0, rel=0.02)  # its modelled rate, its own stamps
    assert rows["memory chip 0 random (seed 7)"]["status"] == "PASS"  # --seed seeds the pattern on any device
    assert r.code == 0 and doc["verdict"] in ("PASS", "NOT JUDGED")


def test_the_memory_patterns_pass_on_a_healthy_board_without_a_profile(cli: Cli) -> None:
    rows = _rows(_selftest(cli))
    assert all(rows[n]["status"] == "PASS" for n in MEMORY), [rows[n]["detail"] for n in MEMORY]
    assert "64 pass(es) over 256 KiB" in rows["memory chip 0 walking ones"]["detail"]


def test_a_stuck_bit_fails_the_patterns_naming_its_address(cli: Cli, tmp_path: Path) -> None:
    # 0x4001234: 0x1234 into chip 1's window, which starts above the mock's 64 MiB firmware reserve.
    plan = _plan(tmp_path, "{kind: stuck_bit, chip: 1, address: 0x4001234, bit: 3, stuck_at: 0, probability: 1}")
    r = _selftest(cli, "--fault-plan", plan)
    assert r.code == 1 and r.json["verdict"] == "FAIL"
    rows = _rows(r)
    for name in ("memory chip 1 walking ones", "memory chip 1 address in address"):
        assert rows[name]["status"] == "FAIL"
        assert "the first at 0x4001234: wrote 0x" in rows[name]["detail"] and "(bit 3)" in rows[name]["detail"]
    assert rows["memory chip 1 walking ones"]["detail"].endswith("wrote 0x08, read 0x00 (bit 3)")
    assert all(rows[f"memory chip 0 {n}"]["status"] == "PASS" for n in ("walking ones", "address in address"))


def test_an_intermittent_bit_flip_fails_its_chip_naming_an_address(cli: Cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{kind: bit_flip, chip: 0, probability: 0.3}")
    r = _selftest(cli, "--fault-plan", plan)
    assert r.code == 1
    rows = _rows(r)
    failed = [rows[n] for n in MEMORY if n.startswith("memory chip 0") and rows[n]["status"] == "FAIL"]
    assert failed and all("the first at 0x" in row["detail"] for row in failed)
    assert all(rows[n]["status"] == "PASS" for n in MEMORY if n.startswith("memory chip 1"))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("schema: calculet-board-profile/v1\ntransfer: {h2d_gbps_min: -1}\n", "/transfer/h2d_gbps_min"),
        ("schema: calculet-board-profile/v1\ntransfer: {}\n", "/transfer"),
        ("schema: calculet-board-profile/v1\ntransfer: {h2d_gbps: 3}\n", "h2d_gbps"),
        ("schema: other/v2\ntransfer: {h2d_gbps_min: 3}\n", "/schema"),
        ("schema: calculet-board-profile/v1\ntransfer: {h2d_gbps_min: .inf}\n", "profile.yaml"),
    ],
)
def test_a_bad_profile_is_a_usage_error_naming_the_field(cli: Cli, tmp_path: Path, text: str, words: str) -> None:
    r = cli("device", "selftest", "--board-profile", _profile(tmp_path, text))
    assert_no_traceback(r)
    assert r.code == 2 and words in r.err, r.err


def test_a_fifo_profile_is_refused_not_waited_on(cli: Cli, tmp_path: Path) -> None:
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    r = cli("device", "selftest", "--board-profile", fifo)
    assert_no_traceback(r)
    assert r.code == 2 and "not a regular file" in r.err


@pytest.mark.parametrize("command", ["check", "reset", "selftest"])
def test_a_report_path_that_is_not_a_regular_file_is_refused_before_the_run(
    cli: Cli, tmp_path: Path, command: str
) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    r = cli("device", command, "--report", fifo)
    assert_no_traceback(r)
    assert r.code == 2 and "is a FIFO, not a regular file" in r.err
    assert fifo.is_fifo()


def test_the_report_file_and_its_page_are_written(cli: Cli, tmp_path: Path) -> None:
    import json

    r = cli("device", "selftest", "--repeats", "1", "--report", tmp_path / "selftest.json")
    assert r.code == 0, r.err[-2000:]
    doc = json.loads((tmp_path / "selftest.json").read_text())
    assert doc["command"] == "device selftest" and doc["device_label"] == "mock"
    assert "MOCK RESULT" in (tmp_path / "selftest.html").read_text()
