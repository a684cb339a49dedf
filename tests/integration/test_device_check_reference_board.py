"""``calctl device check`` and ``device reset`` through the C ABI, on the reference board (a C library that computes).

The known-answer jobs run on the reference board's own C threads; the result is labelled a software model
and names the library, never a mock result or a board. A reset the shim fails (``CALRT_REF_FAULTS=reset_fail=1``)
exits 1 naming the chips it covered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Cli, assert_no_traceback
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)


def _calrt(lib: Path) -> tuple[str, ...]:
    return ("--device", "calrt", "--calrt-lib", str(lib), "--format", "json")


def test_the_reference_board_is_ready_on_its_known_answers(cli: Cli, reference_board: Path) -> None:  # noqa: F811
    r = cli("device", "check", *_calrt(reference_board))
    assert_no_traceback(r)
    assert r.code == 0, r.err[-2000:]
    doc = r.json
    assert doc["ready"] is True and doc["device"] == "calrt" and doc["mock_result"] is False
    assert doc["device_label"] == "software model" and doc["note"].startswith("SOFTWARE MODEL RESULT")
    assert doc["device_options"]["calrt_lib"] == str(reference_board)
    assert [c["known_answer"]["status"] for c in doc["chips"]] == ["PASS", "PASS"]


def test_a_reset_the_shim_fails_exits_1_naming_the_chips(
    cli: Cli,
    reference_board: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CALRT_REF_FAULTS", "reset_fail=1")
    r = cli("device", "reset", "--scope", "board", *_calrt(reference_board))
    assert_no_traceback(r)
    assert r.code == 1
    doc = r.json
    assert (
        doc["error"].startswith("chip 0: the board reset failed") and "chip 1: the board reset failed" in doc["error"]
    )
    assert "device lost" in doc["error"]


def test_a_chip_reset_of_the_reference_board_is_proven(cli: Cli, reference_board: Path) -> None:  # noqa: F811
    r = cli("device", "reset", "--scope", "chip", "--chip", "1", *_calrt(reference_board))
    assert_no_traceback(r)
    assert r.code == 0, r.err[-2000:]
    steps = {s["name"]: s["status"] for s in r.json["steps"]}
    assert steps["chip 1 reset"] == "PASS" and steps["known answer chip 1"] == "PASS"


def test_the_table_names_the_library_and_the_software_model(cli: Cli, reference_board: Path) -> None:  # noqa: F811
    r = cli("device", "check", "--device", "calrt", "--calrt-lib", str(reference_board))
    assert_no_traceback(r)
    assert r.code == 0, r.err[-2000:]
    text = " ".join(r.out.split())  # a narrow terminal may wrap the line
    assert f"on calrt (software model), library {reference_board}: ready" in text
    assert "SOFTWARE MODEL RESULT" in text
