"""Issue 18 acceptance: every device runner through the C ABI, on the reference board (a C library that computes).

``--device calrt --calrt-lib <reference board>``: run-golden and warmup PASS, the
combined PoC is S2 from the per-chip trace (and S1 with the board-wide lock
``CALRT_REF_BOARD_LOCK=1``), soak is clean for 20 cycles. The reference board's
jobs run on its own C threads (two per chip), the GIL is released in every
blocking call, completions come back out of order, and buffers are owned by C
while a job is in flight. ``CALRT_REF_TIME_SCALE=4`` makes its modelled jobs
12-20 ms, as the mock PoC test does with ``--time-scale 4``, so host overhead
does not decide the figures. Results are calrt results naming the library, never
mock results.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, assert_no_traceback, assert_passed
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)

PKG = FIXTURE_PACKAGES / "combined"
TRUST = ("--trusted-key", str(TEST_PUB))


def _calrt(lib: Path) -> tuple[str, ...]:
    return ("--device", "calrt", "--calrt-lib", str(lib))


def _is_calrt_result(doc: dict, lib: Path) -> None:
    assert doc["device"] == "calrt" and doc["mock_result"] is False, doc["device"]
    assert doc["device_options"]["calrt_lib"] == str(lib)
    assert doc["runtime"]["firmware"] == "reference (software model, no hardware)"
    # Issue 28: a software model is labelled like the mock, never read as "this board".
    assert doc["device_label"] == "software model" and doc["runtime"]["software_model"] is True
    assert doc["note"].startswith("SOFTWARE MODEL RESULT") and "not evidence about a Calculet board" in doc["note"]


def test_run_golden_and_warmup_pass_through_the_c_abi(cli: Cli, reference_board: Path) -> None:  # noqa: F811
    r = cli("run-golden", PKG, *TRUST, *_calrt(reference_board), "--format", "json")
    assert_no_traceback(r)
    assert r.code == 0, r.out[-2000:] + r.err[-2000:]
    doc = r.json
    _is_calrt_result(doc, reference_board)
    assert_passed(doc)
    for m in doc["models"]:
        assert m["ok"] is True and m["first_mismatch"] is None and m["got_tokens"] == m["expected_tokens"], m
    r = cli("warmup", PKG, *TRUST, *_calrt(reference_board), "--format", "json")
    assert_no_traceback(r)
    # Warm-up may also warn on latency stability when the shared machine is busy; it must not fail.
    assert r.code == 0 and r.json["verdict"] in ("PASS", "WARN"), r.err[-2000:]
    _is_calrt_result(r.json, reference_board)


def test_poc_combined_is_s2_from_the_per_chip_trace(
    cli: Cli,
    reference_board: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CALRT_REF_TIME_SCALE", "4")
    r = cli(
        "poc",
        "combined",
        PKG,
        "--expect-models",
        "model-a,model-b",
        *TRUST,
        *_calrt(reference_board),
        "--format",
        "json",
    )
    assert_no_traceback(r)
    assert r.code == 0, r.err[-2000:]
    doc = r.json
    _is_calrt_result(doc, reference_board)
    # judged on the board's own job stamps: S2, or NOT JUDGED when a busy host leaves an interval open
    assert doc["verdict"] in ("S2", "NOT JUDGED"), doc["reasons"]
    assert all(rd["clock"] == "device" for rd in doc["rounds"])
    assert doc["decisions"]["per_chip_trace"]["passed"] is not False, doc["reasons"]
    chips = {e["chip"] for e in doc["trace"]} if isinstance(doc["trace"], list) else None
    assert chips is None or chips == {0, 1}
    assert doc["capability"].startswith("not evidence: measured S2 on a software model"), doc["capability"]
    assert "this board" not in doc["capability"]


@pytest.mark.parametrize("load", ["idle", "loaded"])
def test_poc_combined_is_s1_under_the_board_wide_lock(
    cli: Cli,
    reference_board: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    load: str,
) -> None:
    """Issue 26: the board-wide lock is S1 (G3 NO-GO) from the board's own job stamps, idle and on a busy host."""
    from tests.cpu_load import busy_host

    monkeypatch.setenv("CALRT_REF_TIME_SCALE", "4")
    monkeypatch.setenv("CALRT_REF_BOARD_LOCK", "1")
    with busy_host() if load == "loaded" else contextlib.nullcontext():
        r = cli(
            "poc",
            "combined",
            PKG,
            "--expect-models",
            "model-a,model-b",
            *TRUST,
            *_calrt(reference_board),
            "--format",
            "json",
        )
    assert_no_traceback(r)
    assert r.code == 0, r.err[-2000:]
    doc = r.json
    assert doc["verdict"] == "S1", doc["reasons"]
    assert doc["decisions"]["per_chip_trace"]["passed"] is False, doc["decisions"]
    assert any("took turns" in reason for reason in doc["reasons"]), doc["reasons"]


@pytest.mark.slow
def test_soak_twenty_cycles_is_clean(cli: Cli, reference_board: Path, tmp_path: Path) -> None:  # noqa: F811
    r = cli(
        "soak",
        PKG,
        *TRUST,
        *_calrt(reference_board),
        "--cycles",
        "20",
        "--traffic-seconds",
        "0.3",
        "--report",
        tmp_path / "soak",
        "--format",
        "json",
    )
    assert_no_traceback(r)
    assert r.code == 0, r.err[-3000:]
    doc = r.json
    assert doc["ok"] is True and doc["cycles"] == 20 and doc["violations"] == [] and doc["status"] == "finished"
    assert doc["device"] == "calrt" and doc["mock_result"] is False
    assert doc["device_label"] == "software model" and doc["note"].startswith("SOFTWARE MODEL RESULT")
    assert doc["requests"]["sent"] > 0
    on_disk = json.loads((tmp_path / "soak" / "soak-report.json").read_text())
    assert on_disk["cycles"] == 20
