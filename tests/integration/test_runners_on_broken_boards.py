"""Issue 50, item 2: the runners that used to pass a broken board now fail it.

Each board is the reference board built with one vendor bug (a ``-DCALRT_MUTANT_*`` switch, as the conformance
suite builds them): a shim that reports one job in N done before its logits are written, one whose inactive
batch lanes write KV, one whose memory figures are KiB. Before, ``soak`` and ``run-golden`` said PASS on each.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, Cli, assert_no_traceback
from tests.integration.reference_board import _clean_reference_env, reference_board  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

TRUST = ("--trusted-key", str(TEST_PUB))


def _mutant(tmp_path_factory: pytest.TempPathFactory, define: str) -> Path:
    """The reference board built with ``define`` (one or more ``-D`` switches joined by spaces), once a session."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (cc or gcc) on PATH: cannot build the reference board's mutants")
    from calctl.runtime._native.build import build_reference

    name = "-".join(d.removeprefix("-DCALRT_MUTANT_").split("=")[0].lower() for d in define.split())
    # keyed by the switches under the session's base temp: a second test asking for the same board reuses it
    return build_reference(tmp_path_factory.getbasetemp() / f"broken-{name}", defines=tuple(define.split())).library


@pytest.fixture(scope="module")
def b148(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A combined sample with decode profiles 1, 4 and 8 (each B>1 with an inactive-lane contract)."""
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private

    out = tmp_path_factory.mktemp("b148") / "p"
    return build_sample(out, kind="combined", key=load_private(TEST_KEY), decode_profiles=(1, 4, 8))


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
    assert any("calrt_memory_usage is not bytes of this chip" in v["message"] for v in figures), r.json["violations"]


@pytest.mark.parametrize("define", ["-DCALRT_MUTANT_INACTIVE_LANE_KV", "-DCALRT_MUTANT_BATCH_COMPACT"])
def test_run_golden_fails_a_board_whose_batch_lanes_are_wrong(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, define: str
) -> None:
    """BATCH_COMPACT packs the active lanes' logits into the first rows: invisible while the active lanes are
    always 0..k-1, so run-golden's batches run active-lane patterns with gaps."""
    lib = _mutant(tmp_path_factory, define)
    pkg = tmp_path / "b148"
    made = cli("sample-package", pkg, "--key", TEST_KEY, "--profiles", "1,4,8")
    assert made.code == 0, made.err
    r = cli("run-golden", pkg, *TRUST, *_calrt(lib), "--format", "json")
    assert_no_traceback(r)
    assert r.code == 1, r.out[-2000:]
    reasons = [m["reason"] for m in r.json["models"] if not m["ok"]]
    assert reasons and " lane " in reasons[0] and (": B4 " in reasons[0] or ": B8 " in reasons[0]), reasons
    if define.endswith("BATCH_COMPACT"):  # the job that produced the wrong token: its chip, graph and lanes
        assert re.search(r"from job \S+ on chip [\d, ]+, \w+_decode, lanes [\d, ]+ of B[48] active", reasons[0])


def _soak(cli: Cli, pkg: Path, out: Path, *device: str | Path, cycles: int = 1, seconds: float = 2.0) -> Any:
    r = cli(
        "soak", pkg, *TRUST, *device, "--cycles", str(cycles), "--traffic-seconds", str(seconds),
        "--report", out, "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    return r


@pytest.mark.parametrize(
    "board", ["mock fault inactive_lane_kv", "-DCALRT_MUTANT_INACTIVE_LANE_KV", "-DCALRT_MUTANT_KV_POS_PLUS_ONE"]
)
def test_soak_fails_a_board_whose_inactive_lanes_write_kv_naming_request_chip_graph_and_lane(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, b148: Path, board: str
) -> None:
    """The soak served B1 only (serving's default configuration), so it never formed a batch: boards whose batch
    jobs are wrong (inactive lanes that write KV, a B>1 kernel writing K/V one row too far) passed it on a 1,4,8
    package. Now every compiled profile runs with inactive lanes, and a wrong token names its lane."""
    if board.startswith("-D"):
        device: tuple[str | Path, ...] = _calrt(_mutant(tmp_path_factory, board))
    else:
        plan = tmp_path / "plan.yaml"
        plan.write_text("schema: calctl-fault-plan/v1\nfaults:\n  - {kind: inactive_lane_kv, probability: 1.0}\n")
        device = ("--fault-plan", plan)
    r = _soak(cli, b148, tmp_path / "soak", *device)
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    served = [v for v in r.json["violations"] if v["kind"] == "output_mismatch" and v["subject"].endswith(":output")]
    assert served, r.json["violations"]
    msg = served[0]["message"]
    assert msg.startswith("request soak-model-") and " on chip " in msg and "_decode" in msg, msg
    assert re.search(r"from its decode job \d+, B[48] lane \d+ \(\d active, \d inactive\)", msg), msg


@pytest.mark.parametrize("board", ["mock", "reference"])
def test_soak_runs_every_profile_with_inactive_lanes_and_passes_a_healthy_board(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest, b148: Path, board: str
) -> None:
    device: tuple[str | Path, ...] = () if board == "mock" else _calrt(request.getfixturevalue("reference_board"))
    r = _soak(cli, b148, tmp_path / "soak", *device)
    assert r.code == 0, r.json["violations"]
    ran = r.json["output_verification"]["decode_profiles"]
    for b in ("B4", "B8"):  # both models' cores form partial batches of every profile (3 clients each)
        assert sum(ran[alias][b]["with_inactive_lanes"] for alias in ("model-a", "model-b")) > 0, ran
    probes = r.json["output_verification"]["gapped_lane_probes"]
    assert {a: sorted(p) for a, p in probes.items()} == {"model-a": ["B4", "B8"], "model-b": ["B4", "B8"]}, probes
    assert all(p["ok"] and p["jobs"] > 0 for per in probes.values() for p in per.values()), probes


def test_soak_fails_a_board_that_packs_the_active_lanes_logits(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, b148: Path
) -> None:
    """BATCH_COMPACT writes the active lanes' logits into rows 0..k-1. Serving binds a batch's requests to lanes
    0..k-1, so served traffic cannot show it: the soak's own batches with gapped active lanes do."""
    r = _soak(cli, b148, tmp_path / "soak", *_calrt(_mutant(tmp_path_factory, "-DCALRT_MUTANT_BATCH_COMPACT")))
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    wrong = [v for v in r.json["violations"] if v["kind"] == "output_mismatch"]
    assert wrong, r.json["violations"]
    pattern = (
        r"^gapped-lane probe: model-[ab]: B[48] lane \d+ \(pool \d+ prompt\): output token \d+ \(KV position \d+\) "
        r"from job \S+ on chip \d, model_[ab]_decode, lanes [\d, ]+ of B[48] active: expected \d+"
    )
    assert all(re.search(pattern, v["message"]) for v in wrong), wrong


def test_soak_fails_a_board_that_swaps_the_chips_memory_figures(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Both models loaded at once, each swapped figure still grew by at least its chip's weights (the two plans are
    about the same size): the soak said PASS and would judge every drift on the wrong chip. Each model is now loaded
    alone before the first load, so the figures must follow it."""
    lib = _mutant(tmp_path_factory, "-DCALRT_MUTANT_MEMORY_SWAPPED")
    r = _soak(cli, FIXTURE_PACKAGES / "combined", tmp_path / "soak", *_calrt(lib), seconds=0.5)
    assert r.code == 1, r.out[-2000:]
    figures = [v["message"] for v in r.json["violations"] if v["kind"] == "memory_figures"]
    assert any("calrt_memory_usage" in m and "attributed to the wrong chip" in m for m in figures), figures


def test_bringup_fails_a_library_that_frees_a_sequence_a_job_still_writes(
    cli: Cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No model step frees a KV sequence while a job writes it, so golden, PoC and soak pass this board; the
    bring-up's conformance step tries the promise (KV-3) and fails it there, and the model's steps still run."""
    lib = _mutant(tmp_path_factory, "-DCALRT_MUTANT_KV_FREE_IN_FLIGHT")
    out = tmp_path / "b"
    r = cli(
        "bringup", FIXTURE_PACKAGES / "combined", *TRUST, *_calrt(lib), "--level", "quick", "--report", out,
        "--format", "json",
    )  # fmt: skip
    assert_no_traceback(r)
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    doc = json.loads((out / "report.json").read_text())
    steps = {s["step"]: s for s in doc["summary"]}
    conf = steps["conformance"]
    assert conf["verdict"] == "FAIL" and "kv_busy_in_flight" in conf["detail"] and "KV-3" in conf["detail"], conf
    assert doc["verdict"] == "FAIL" and doc["error"].startswith("conformance: kv_busy_in_flight"), doc["error"]
    assert steps["run-golden"]["verdict"] in ("PASS", "WARN"), steps["run-golden"]  # the pipeline went on
    failed = doc["board"]["conformance"]["failed"]
    assert [f["name"] for f in failed] == ["kv_busy_in_flight"] and "KV-3" in failed[0]["clauses"], failed
    assert json.loads((out / "conformance.json").read_text())["verdict"] == "FAIL"
