"""000 §19 M3: ``calctl bench --scenario batch`` serves one request set at B1, B4, B8 and B16 in-process on the mock.

The CLI run builds its own B1/B4/B8/B16 sample in the report directory (the
bundled samples are B1 only), reports fill ratio, tokens/s and P99 per profile
and checks every request's tokens against B1. A corrupted decode job at B4 must
be caught and named (request and profile), never averaged away.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calctl.runners.bench.batch import BatchOptions, build_batch_sample, run_batch, scenario_result
from calctl.runners.bench.bench_report import scenario_report
from calctl.runners.device import DeviceSpec
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, assert_no_traceback

pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_batch_scenario_reports_every_profile_and_matches_b1(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    r = cli("bench", "--scenario", "batch", "--time-scale", "1", "--format", "json", "--report", out)
    assert_no_traceback(r)
    assert r.code == 0, r.err
    doc = r.json
    assert doc["scenario"] == "batch" and doc["verdict"] == "PASS" and doc["mock_result"] is True
    assert doc["device_options"]["kind"] == "mock" and doc["device_options"]["time_scale"] == 1.0
    assert doc["workload"]["requests"] == 64 and doc["package"].endswith("batch-sample-package")
    rows = {p["profile"]: p for p in doc["profiles"]}
    assert list(rows) == ["B1", "B4", "B8", "B16"]
    for name, row in rows.items():
        assert row["errors"] == 0 and row["requests"] == 64, row
        assert row["lanes_match_b1"] and row["mismatches"] == [], row
        assert row["output_tokens"] == 64 * 16
        assert 0.0 < row["fill_ratio"] <= 1.0 and row["throughput_tokens_per_s"] > 0
        assert row["e2e_s"]["n"] == 64 and row["tpot_s"]["n"] == 64
        assert row["p99_judged"] is False  # 64 < 100 samples: shown, NOT JUDGED
        if name != "B1":
            assert row["padding_lanes"] > 0  # a closed loop never fills every lane of every job
    assert rows["B1"]["fill_ratio"] == 1.0 and rows["B1"]["padding_lanes"] == 0
    assert [g["name"] for g in doc["gates"]] == [
        "B4.lanes_match_b1",
        "B8.lanes_match_b1",
        "B16.lanes_match_b1",
        "B4.kv_fault_recovered",  # the KV-fault phase at the first batched profile (000 §19 M3)
    ]
    assert all(g["verdict"] == "PASS" for g in doc["gates"])
    assert any("not judged" in n for n in doc["notes"])
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC
    assert (out / "bench-report.json").is_file()
    assert (out / "batch-sample-package" / "manifest.yaml").is_file()


def test_corrupted_lane_is_caught_and_named(tmp_path: Path) -> None:
    pkg = build_batch_sample(tmp_path / "pkg")
    # The 5th decode job of each batched run returns perturbed logits: greedy tokens change from there on.
    rule = FaultRule(FaultKind.CORRUPT_OUTPUT, at=(5,), graph="model_a_decode", magnitude=50.0)
    batch = run_batch(
        BatchOptions(
            pkg,
            make_policy(None, False, trust_test_key=True),
            device=DeviceSpec(time_scale=1.0),
            profiles=(4,),
            requests_per_lane=2,
            inject=rule,
        )
    )
    res = scenario_result(batch)
    assert res.verdict == "FAIL" and scenario_report("bench", res, {}).exit_code == 1  # the report's exit code
    b4 = batch.runs[1]
    assert b4.batch == 4 and b4.mismatches, "a corrupted decode job must show as a mismatch against B1"
    assert all(m.startswith("batch-") and "B4 differs from B1 at output token" in m for m in b4.mismatches)
    gate = res.gates[0]
    assert gate.name == "B4.lanes_match_b1" and gate.passed is False
    assert any(n.startswith("failing gate B4.lanes_match_b1: batch-") for n in res.notes)
    assert batch.runs[0].mismatches == []  # the B1 reference ran without the fault


def test_package_without_batched_profiles_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    r = cli(
        "bench",
        "--scenario",
        "batch",
        str(FIXTURE_PACKAGES / "combined"),
        "--trusted-key",
        str(TEST_PUB),
        "--report",
        tmp_path / "u",
    )
    assert_no_traceback(r)
    assert r.code == 2, r.err
    assert "B4, B8, B16" in r.err and "--profiles 1,4,8,16" in r.err, r.err
    r = cli("bench", "--scenario", "batch", "--url", "http://127.0.0.1:1", "--report", tmp_path / "v")
    assert r.code == 2 and "--url does not apply" in r.err, r.err


def test_an_interrupted_batch_keeps_its_finished_profiles_and_picture(tmp_path: Path) -> None:
    """Issue 29 item 12: SIGINT once B1 is served ends the scenario INTERRUPTED (exit 130) with the B1 profile
    in bench-report.json and bench.png drawn from it; nothing is judged."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "rep"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "calctl", "bench", "--scenario", "batch", "--time-scale", "1", "--report", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the B1 reference is served once its line is logged
            if line.strip().startswith("B1:"):
                break
        else:
            pytest.fail(f"the bench ended before its B1 profile was served ({proc.wait(30)})")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    doc = json.loads((out / "bench-report.json").read_text())
    assert doc["verdict"] == "INTERRUPTED" and doc["exit_code"] == 130 and doc["gates"] == []
    assert "profiles" in doc, (doc["notes"], stderr[-3000:])
    assert doc["profiles"][0]["profile"] == "B1" and doc["profiles"][0]["requests"] == 64, doc["profiles"]
    assert doc["phases_finished"][0] == "B1" and doc["interrupted_in"] != "B1"
    assert any("interrupted (SIGINT" in n and "finished phase(s) reported: B1" in n for n in doc["notes"])
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC and "plot: None" not in stdout
