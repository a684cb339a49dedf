"""Conformance that a broken shim cannot pass: broken copies of the reference board, one bug each.

Each mutant is the reference board's own source (calctl/runtime/_native/reference/calrt_reference.c)
compiled with one ``-DCALRT_MUTANT_*`` switch, at test time; nothing prebuilt is committed. The full
suite runs against it through ``calctl device conformance`` (child processes, as a vendor runs it):
it must exit 1 with a FAIL row for the check that owns the bug. The unmodified board passes the same
suite (test_conformance.py::test_suite_runs_in_child_processes_and_grades_the_vendor_questions).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import assert_no_traceback

#: switch -> (the check whose FAIL row must name the bug, words its detail must contain)
MUTANTS = {
    "-DCALRT_MUTANT_UNLOAD_LEAK": ("memory_counters", "memory"),
    "-DCALRT_MUTANT_BOARD_RESET_KEEPS_KV": ("chip_vs_board_reset", "after a board reset"),
    "-DCALRT_MUTANT_QUERY_NO_TAGS": ("job_states_timestamps", "calrt_job_query must echo"),
    "-DCALRT_MUTANT_STALE_EVERY=64": ("concurrent_submit_two_chips", "another job's output"),
    "-DCALRT_MUTANT_SUBMIT_DEADLOCK": ("concurrent_submit_two_chips", "deadlock"),
}


def _mutant(tmp_path_factory: pytest.TempPathFactory, define: str) -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc) on PATH: cannot build the reference board's mutants")
    from calctl.runtime._native.build import build_reference

    name = define.removeprefix("-DCALRT_MUTANT_").split("=")[0].lower()
    return build_reference(tmp_path_factory.mktemp(f"mutant-{name}"), defines=(define,)).library


@pytest.mark.parametrize("define", list(MUTANTS), ids=lambda d: d.removeprefix("-DCALRT_MUTANT_"))
def test_conformance_fails_a_broken_reference_board_naming_the_check(
    cli,  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory,
    define: str,
) -> None:
    library = _mutant(tmp_path_factory, define)
    check, words = MUTANTS[define]
    r = cli("device", "conformance", "--calrt-lib", library, "--check-timeout", "30", "--format", "json")
    assert_no_traceback(r)
    assert r.code == 1, (define, r.out[-2000:], r.err[-2000:])
    rows = {c["name"]: c for c in r.json["checks"]}
    row = rows[check]
    assert row["verdict"] == "FAIL", (define, row)
    assert words in row["detail"], (define, row["detail"])
    assert row["call"], row  # the row names the call that showed it
    if define == "-DCALRT_MUTANT_SUBMIT_DEADLOCK":
        assert "calrt_job_submit" in row["call"], row
    # A bug fails its own check: every check after an abandoned process still ran, in a fresh one.
    assert [c["name"] for c in r.json["checks"]][-1] == "golden_compute"


def test_a_mutant_build_is_keyed_apart_from_the_board(tmp_path: Path) -> None:
    from calctl.errors import UsageError
    from calctl.runtime._native.build import build_reference, source_digest

    assert source_digest(("-DCALRT_MUTANT_UNLOAD_LEAK",)) != source_digest()
    with pytest.raises(UsageError, match="expected -DNAME"):
        build_reference(tmp_path, defines=("-O0 -DX",))
