"""Helpers of the ``calctl accept`` tests (docs/accept.md): the tests live in three files so pytest-xdist runs
their expensive quick-level runs on different workers at once (test_accept.py: the mock's untimed rows and the
rollback; test_accept_timed.py: G3/G4 and the runs cut short; test_accept_reference_board.py: the C reference
board)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, run_in_process

COMBINED = FIXTURE_PACKAGES / "combined"
REPLICA = FIXTURE_PACKAGES / "replica"
TRUST = ("--trusted-key", str(TEST_PUB))

ROW_IDS = ["G0", "G1", "G2", "G3", "G4", "G5", "M0", "M1", "M2", "M3", "M4"]


def run_accept(*args: str | Path) -> tuple[int, str, str]:
    """calctl in-process, stdout and stderr captured (usable from a module-scoped fixture)."""
    r = run_in_process(*args)
    return r.code, r.out, r.err


def rows_by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in doc["rows"]}


def quick_level(out: Path, only: str, *extra: str | Path) -> tuple[int, dict[str, Any], Path, str]:
    code, stdout, stderr = run_accept(
        "accept", COMBINED, "--replica", REPLICA, *TRUST, "--level", "quick", "--only", only, *extra,
        "--report", out, "--format", "json",
    )  # fmt: skip
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    return code, json.loads(stdout), out, stderr


# The quick level on the mock in two runs, one per file: the timed rows (G3 overlap, the G4 grade; on the
# device's clock) in test_accept_timed.py, and G0-G2, G5, M0, M3 and M4 in test_accept.py. M1/M2 (the
# executor-modes scenario) are measured by tests/integration/test_executor_modes.py on the mock and, as rows
# of one run of every row in one report, by test_accept_reference_board.py.
TIMED_ROWS = ("G3", "G4")
OTHER_ROWS = tuple(r for r in ROW_IDS if r not in (*TIMED_ROWS, "M1", "M2"))


def assert_rows_shape(doc: dict[str, Any], out: Path, asked: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    rows = rows_by_id(doc)
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


def assert_no_traceback_text(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
