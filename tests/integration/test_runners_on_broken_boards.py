"""Issue 50, item 2: the runners that used to pass a broken board now fail it.

Each board is the reference board built with one vendor bug (a ``-DCALRT_MUTANT_*`` switch, as the conformance
suite builds them): a shim that reports one job in N done before its logits are written, one whose inactive
batch lanes write KV, one whose memory figures are KiB. Before, ``soak`` and ``run-golden`` said PASS on each.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, Cli, assert_no_traceback
from tests.integration.reference_board import _clean_reference_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

TRUST = ("--trusted-key", str(TEST_PUB))


def _mutant(tmp_path_factory: pytest.TempPathFactory, define: str) -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc) on PATH: cannot build the reference board's mutants")
    from calctl.runtime._native.build import build_reference

    name = define.removeprefix("-DCALRT_MUTANT_").split("=")[0].lower()
    return build_reference(tmp_path_factory.mktemp(f"broken-{name}"), defines=(define,)).library


def _calrt(lib: Path) -> tuple[str, ...]:
    return ("--device", "calrt", "--calrt-lib", str(lib))


def test_soak_fails_a_board_that_reports_jobs_done_before_their_logits(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    lib = _mutant(tmp_path_factory, "-DCALRT_MUTANT_EARLY_DONE_EVERY=50")
    r = cli(
        "soak", FIXTURE_PACKAGES / "combined", *TRUST, *_calrt(lib), "--cycles", "2", "--traffic-seconds", "1.5",
        "--report", tmp_path / "soak", "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    kinds = {v["kind"] for v in r.json["violations"]}
    # Every answer is held to its B1 twin: a wrong one is output_mismatch; a zeroed row the engine faults
    # (degenerate logits) ends requests in device errors and recoveries, which the soak counts too.
    assert kinds & {"output_mismatch", "recovery", "device_errors", "request_failed", "load_failed"} or (
        r.json["errors"]["device_errors"] or r.json["errors"]["recoveries"]
    ), r.json["violations"]


def test_soak_fails_a_board_whose_memory_figures_are_kib(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    lib = _mutant(tmp_path_factory, "-DCALRT_MUTANT_MEMORY_KIB")
    r = cli(
        "soak", FIXTURE_PACKAGES / "combined", *TRUST, *_calrt(lib), "--cycles", "1", "--traffic-seconds", "0.5",
        "--report", tmp_path / "soak", "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, r.out[-2000:]
    figures = [v for v in r.json["violations"] if v["kind"] == "memory_figures"]
    assert figures and "calrt_memory_usage is not bytes of this chip" in figures[0]["message"], r.json["violations"]


def test_run_golden_fails_a_board_whose_inactive_lanes_write_kv(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    lib = _mutant(tmp_path_factory, "-DCALRT_MUTANT_INACTIVE_LANE_KV")
    pkg = tmp_path / "b148"
    made = cli("sample-package", pkg, "--key", TEST_KEY, "--profiles", "1,4,8")
    assert made.code == 0, made.err
    r = cli("run-golden", pkg, *TRUST, *_calrt(lib), "--format", "json")
    assert_no_traceback(r)
    assert r.code == 1, r.out[-2000:]
    reasons = [m["reason"] for m in r.json["models"] if not m["ok"]]
    assert reasons and " lane " in reasons[0] and (": B4 " in reasons[0] or ": B8 " in reasons[0]), reasons
