"""``calctl accept`` at the quick level through the C reference board (``--device calrt``, docs/accept.md): every
row of one report, the ones the board's timing gives measured, not asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.accept_harness import (
    COMBINED,
    REPLICA,
    ROW_IDS,
    TRUST,
    assert_no_traceback_text,
    rows_by_id,
    run_accept,
)
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow  # the quick level's every row through the C ABI: one run


def test_quick_level_through_the_reference_board(tmp_path: Path, reference_board: Path) -> None:  # noqa: F811
    """The same quick level through the C ABI. What the board's timing gives (S1/S2, every request served within
    its timeout) is measured, not asserted: the rows that need the mock's fault injection are NOT MEASURED with
    the reason, and every other row is measured (GO or NO-GO), calrt-labelled, its evidence on disk."""
    out = tmp_path / "r"
    code, stdout, stderr = run_accept(
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
    rows = rows_by_id(doc)
    assert doc["status"] == "finished" and list(rows) == ROW_IDS
    assert code == (1 if doc["counts"]["NO-GO"] else 0), doc["summary"]
    assert doc["device"] == "calrt" and doc["mock_result"] is False
    assert doc["device_label"] == "software model" and doc["note"].startswith("SOFTWARE MODEL RESULT"), doc["note"]
    assert doc["device_options"]["calrt_lib"] == str(reference_board)
    for rid in ("G0", "G1"):
        assert rows[rid]["verdict"] == "GO", rows[rid]
    # Measured through the C ABI, whatever the verdict. The reference board's chips are threads of this host: beside
    # a saturated host's burners its intervals can still straddle a gate after the quick level's rounds, or its
    # requests time out, and the row then says which and what would measure it (never a GO or NO-GO it did not see).
    load_outcomes = {"G2": "request(s) timed out: a load outcome", "G3": "not judged after "}
    for rid, load_outcome in load_outcomes.items():
        row = rows[rid]
        assert row["files"] and all((out / p).is_file() for p in row["files"].values()), row
        if row["verdict"] == "NOT MEASURED":
            assert load_outcome in row["reason"] and "not saturated" in row["how_to_measure"], row
        else:
            assert row["verdict"] in ("GO", "NO-GO"), row
    assert rows["G4"]["verdict"] == "NOT MEASURED" and "mock" in rows["G4"]["reason"], rows["G4"]
    assert rows["G5"]["verdict"] == "NOT MEASURED" and "/100 cycles" in rows["G5"]["reason"]
    assert "no --previous package given" in rows["G5"]["reason"]  # run without one: the rollback is not measured
    g3 = json.loads((out / "poc.json").read_text())
    assert g3["device"] == "calrt" and g3["runtime"]["firmware"] == "reference (software model, no hardware)"
    # M1/M2 from the executor-modes scenario at the quick level's 3 rounds, through the C ABI.
    steps = {s["name"]: s for s in doc["steps"]}
    # the board's library against every ABI promise first, at the run's level: the reference board keeps them
    assert steps["conformance"]["status"] == "PASS", steps["conformance"]
    assert "checks PASS at --level quick" in steps["conformance"]["key_figure"], steps["conformance"]
    assert doc["board"]["conformance"]["failed"] == [] and (out / "conformance.json").is_file()
    assert steps["executor-modes"]["status"] in ("PASS", "WARN", "FAIL"), steps["executor-modes"]  # it ran
    assert rows["M1"]["files"] and all((out / p).is_file() for p in rows["M1"]["files"].values()), rows["M1"]
    assert rows["M2"]["verdict"] != "GO", rows["M2"]  # 24 h of ping/pong is never reached at the quick level
