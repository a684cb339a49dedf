"""Issue 6 acceptance: ``calctl poc combined`` on the mock device (001 §6.4, §13.2).

The mock's chips really run in parallel, so the combined sample must come out S2 with an
efficiency of at least 0.95; with ``--serialize-chips`` (a modelled global runtime lock) it must
come out S1 and say why. A package whose sections reach the other chip is refused before
configure, and crosstalk injected mid-round is caught naming model, round and position.
A mock ``--time-scale`` of 4 makes simulated jobs 12-20 ms, so the host overhead of the mock
(well under 1 ms a job) does not decide the figures.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from calctl.compiler import writer
from calctl.package.model import MANIFEST, RESERVED_INFO
from calctl.signing import keys, seal
from tests.conftest import FIXTURE_PACKAGES, TEST_KEY, TEST_PUB, Cli, CliResult, assert_no_traceback

TRUST = ("--trusted-key", str(TEST_PUB))
FLOW = [
    "open device",
    "validate package",
    "load package",
    "create calbin",
    "check names and chip targets",
    "configure",
    "allocate A/B buffers",
    "golden model-a",
    "golden model-b",
    "concurrent rounds",
    "verify outputs",
    "overlap verdict",
    "drain",
    "reset configuration",
    "release",
]


def _poc(cli: Cli, pkg: Path, *args: object, expect: str = "model-a,model-b") -> CliResult:
    r = cli("poc", "combined", pkg, "--expect-models", expect, *TRUST, "--format", "json", *args)
    assert_no_traceback(r)
    return r


def _steps(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in doc["steps"]}


def _resealed(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the combined sample with ``edit`` applied to its manifest, resealed with the test key."""
    import shutil

    root = tmp_path / "bad-combined"
    shutil.copytree(FIXTURE_PACKAGES / "combined", root)
    doc = yaml.safe_load((root / MANIFEST).read_text())
    edit(doc)
    (root / MANIFEST).write_bytes(writer.dump_manifest(doc))
    (root / RESERVED_INFO).write_bytes(
        writer.render_reserved_info(doc["memory_plan"], doc["device_cfg"]["chip_dram_bytes"])
    )
    writer.refresh_provenance(root)
    seal.seal(root, keys.load_private(TEST_KEY))
    return root


def test_combined_sample_is_s2_on_the_mock(cli: Cli, tmp_path: Path) -> None:
    trace, plot = tmp_path / "poc.trace.json", tmp_path / "poc.png"
    r = _poc(cli, FIXTURE_PACKAGES / "combined", "--rounds", 4, "--time-scale", 4, "--trace", trace, "--plot", plot)
    assert r.code == 0, r.err
    doc = r.json
    assert doc["verdict"] == "S2" and doc["device"] == "mock" and doc["mock_result"] is True
    assert doc["throughput_efficiency"]["mean"] >= 0.95
    o = doc["overlap_ratio"]
    assert set(o) >= {"mean", "ci_low", "ci_high"} and o["ci_low"] > 0 and o["n"] == 4
    assert doc["both_busy_fraction"] > 0.5
    # 001 §1: the S2 reason names the per-chip trace evidence, not wall clock alone; every figure is on the
    # device's clock (the mock's simulated timeline), the host's share reported beside it.
    assert doc["reasons"][0].startswith("per-chip trace share CI "), doc["reasons"]
    assert all(rd["clock"] == "device" for rd in doc["rounds"])
    assert doc["host_overhead"]["clock"] == "device" and doc["host_overhead"]["host_seconds"] > 0
    assert set(doc["decisions"]) == {"per_chip_trace", "overlap_ratio", "throughput_efficiency"}
    assert all(d["passed"] is True for d in doc["decisions"].values())
    assert [s["name"] for s in doc["steps"]] == FLOW  # exactly 001 §6.4, in that order
    assert all(s["status"] == "PASS" for s in doc["steps"] if s["name"] != "validate package")
    assert doc["placement"] == {
        "model-a": {"chip": 0, "graphs": ["model_a_prefill", "model_a_decode"]},
        "model-b": {"chip": 1, "graphs": ["model_b_prefill", "model_b_decode"]},
    }
    assert not set(doc["buffers"]["model-a"]) & set(doc["buffers"]["model-b"])
    assert [g["ok"] for g in doc["golden"]] == [True, True]
    xt = doc["crosstalk"]
    assert xt["mismatch_count"] == 0 and xt["checked_generations"] == 4 * 4 and xt["meets_gate"] is False
    assert doc["capability"].startswith("not evidence") and doc["runtime"]["runtime"] == "0.7.6"
    assert len(doc["rounds"]) == 4 and all(rd["t_joint"] < rd["t_a"] + rd["t_b"] for rd in doc["rounds"])
    # the trace: one track per chip, one slice per job with model/graph/engine/generation
    events = json.loads(trace.read_text())["traceEvents"]
    jobs = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in jobs} == {0, 1}
    assert {e["args"]["model"] for e in jobs if e["tid"] == 1} == {"model-b"}
    assert all(e["args"]["generation"] == 1 for e in jobs)
    png = plot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] > 400


def test_serialised_chips_are_s1_and_the_report_says_why(cli: Cli) -> None:
    r = _poc(cli, FIXTURE_PACKAGES / "combined", "--rounds", 3, "--time-scale", 2, "--serialize-chips")
    assert r.code == 0, r.err  # S1 is a finding, not a tool failure
    doc = r.json
    assert doc["verdict"] == "S1"
    # the modelled global lock: on the device's clock the chips never compute together, at any host load
    assert doc["decisions"]["per_chip_trace"]["passed"] is False
    assert doc["per_chip_trace_share"]["ci_high"] == 0.0
    assert any("both chips computing during 0%" in reason and "took turns" in reason for reason in doc["reasons"])
    assert _steps(doc)["overlap verdict"]["status"] == "WARN"
    assert doc["device_options"]["serialize_chips"] is True
    r = _poc(cli, FIXTURE_PACKAGES / "combined", "--rounds", 2, "--time-scale", 2, "--serialize-chips", "--require-s2")
    assert r.code == 1 and r.json["verdict"] == "S1" and "S2 was required" in r.json["error"]


def test_replica_package_runs_phase_2_with_different_prompts(cli: Cli) -> None:
    r = _poc(cli, FIXTURE_PACKAGES / "replica", "--rounds", 2, "--time-scale", 2, expect="model-a1,model-a0")
    assert r.code == 0, r.err
    doc = r.json
    assert doc["verdict"] in ("S1", "S2") and "Phase 2" in doc["phase"]
    loads = {w["alias"]: w for w in doc["workloads"]}
    assert loads["model-a0"]["reference"] == "golden" and loads["model-a1"]["reference"] == "isolated run"
    assert loads["model-a1"]["prompt_tokens"] < loads["model-a0"]["prompt_tokens"]
    assert doc["crosstalk"]["mismatch_count"] == 0


def test_mask_overreach_exits_1_before_configure(cli: Cli, tmp_path: Path) -> None:
    def overreach(doc: dict[str, Any]) -> None:
        doc["models"][1]["graphs"][0]["sections"][0]["chip_mask"] = 3  # model B's prefill code also on chip 0

    bad = _resealed(tmp_path, overreach)
    r = _poc(cli, bad)
    assert r.code == 1
    doc = r.json
    assert doc["verdict"] == "FAIL" and "failed validation" in doc["error"]
    assert any(rule.startswith("CHIP") for rule in doc["validation"]["failed_rules"])
    steps = _steps(doc)
    assert steps["validate package"]["status"] == "FAIL"
    for name in ("create calbin", "check names and chip targets", "configure", "golden model-a", "concurrent rounds"):
        assert steps[name]["status"] == "SKIP" and steps[name]["detail"].startswith("not reached: validate package")
    assert "overlap_ratio" not in doc and doc["programs"] == []


def test_model_names_must_be_exactly_the_expected_ones(cli: Cli) -> None:
    r = _poc(cli, FIXTURE_PACKAGES / "combined", expect="model-a,model-c")
    assert r.code == 1 and _steps(r.json)["configure"]["status"] == "SKIP"
    assert "MAN004" in r.json["validation"]["failed_rules"]
    r = cli("poc", "combined", FIXTURE_PACKAGES / "combined", *TRUST)  # a real package must name its models
    assert r.code == 2 and "--expect-models is required" in r.err


def test_crosstalk_in_a_joint_round_exits_1_naming_model_round_and_position(cli: Cli, tmp_path: Path) -> None:
    # model_b_decode jobs: 1-15 golden B, 16-30 round 0 alone, 31-45 round 0 joint -> job 35 is joint decode[4].
    plan = tmp_path / "xt.yaml"
    plan.write_text(
        "schema: calctl-fault-plan/v1\nfaults:\n"
        "  - {kind: corrupt_output, job: 35, graph: model_b_decode, magnitude: 8.0}\n"
    )
    r = _poc(cli, FIXTURE_PACKAGES / "combined", "--rounds", 2, "--time-scale", 2, "--fault-plan", plan)
    assert r.code == 1
    doc = r.json
    assert doc["verdict"] == "FAIL"
    first = doc["crosstalk"]["mismatches"][0]
    assert first.startswith("model-b: round 0 (joint): decode[4]: output token 5: expected ")
    assert first in doc["error"] and doc["crosstalk"]["mismatch_count"] == 1
    steps = _steps(doc)
    assert steps["verify outputs"]["status"] == "FAIL" and steps["overlap verdict"]["status"] == "SKIP"


def test_a_refused_model_set_names_the_missing_and_the_unexpected_aliases(cli: Cli) -> None:
    """Issue 21: not just "MAN004"; and the footer never prints `package None sha256:n/a`."""
    r = cli("poc", "combined", FIXTURE_PACKAGES / "combined", "--expect-models", "model-a,model-x", *TRUST)
    assert_no_traceback(r)
    assert r.code == 1
    assert "expected model 'model-x' is not in the package" in r.out
    assert "model 'model-b' is not one of the expected models" in r.out
    assert "package None" not in r.out and "sha256:n/a" not in r.out
    assert "refused before it was loaded" in r.out
