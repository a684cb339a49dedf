"""000 §19 M3 "KV fault 可恢复" on the mock: a CCU fault in a batched decode job, and the engine's recovery.

The batch scenario's KV-fault phase (calctl/runners/bench/batch_fault.py) arms a ``ccu_exception`` on a B4
decode job with several lanes: those lanes end ``device_error`` (000 §7.4), the engine resets and recovers,
the other and later requests are served with the B1 reference's tokens and the KV is back to rest (000 §9.2,
§18). A fault plan whose resets all fail breaks the recovery: the phase says so, the scenario FAILs and M3
is NO-GO naming it. ``calctl accept --only M3 --targets docs/examples/accept-targets.yaml`` on the bundled
sample (B1 and B4) is GO on the mock.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calctl.report import StepStatus
from calctl.runners.acceptance.milestones import judge_m3
from calctl.runners.acceptance.rows import GateDecision, StepEvidence
from calctl.runners.bench.base import ScenarioResult
from calctl.runners.bench.batch import BatchOptions, BatchResult, build_batch_sample, run_batch, scenario_result
from calctl.runners.device import DeviceSpec
from calctl.signing.policy import make_policy
from tests.conftest import Cli, assert_no_traceback

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "accept-targets.yaml"


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_batch_sample(tmp_path_factory.mktemp("batch") / "pkg")


def _run(pkg: Path, plan: Path | None = None) -> tuple[BatchResult, ScenarioResult]:
    batch = run_batch(
        BatchOptions(
            pkg,
            make_policy(None, False, trust_test_key=True),
            device=DeviceSpec(time_scale=1.0, fault_plan=plan),
            profiles=(4,),
            requests_per_lane=2,
        )
    )
    return batch, scenario_result(batch)


def test_a_ccu_fault_in_a_batched_job_is_recovered(pkg: Path) -> None:
    _, res = _run(pkg)
    kv = res.body["kv_fault"]
    assert kv["measured"] and kv["profile"] == "B4", kv
    assert kv["recovered"] is True and kv["problems"] == [], kv["summary"]
    assert kv["fired"] and kv["faulted_lanes"] >= 2  # a batched fault: several lanes of one job
    assert len(kv["device_errors"]) >= 2 and set(kv["during"]) <= {"ok", "device_error"}
    assert kv["later"] == {"ok": 4} and kv["mismatches"] == []
    assert kv["recoveries"] and all(r["ok"] for r in kv["recoveries"]) and kv["ready_after"] is True
    assert kv["kv_after"]["lanes"] == kv["kv_before"]["lanes"] and kv["kv_after"]["used_tokens"] == 0
    gate = next(g for g in res.gates if g.name == "B4.kv_fault_recovered")
    assert gate.passed is True and res.verdict == "PASS"


def test_a_broken_recovery_fails_the_phase_and_m3_is_no_go(pkg: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("schema: calctl-fault-plan/v1\nfaults:\n  - {kind: reset_failure, probability: 1.0}\n")
    _, res = _run(pkg, plan)
    kv = res.body["kv_fault"]
    assert kv["recovered"] is False and kv["ready_after"] is False, kv
    assert any(p.startswith("recovery failed:") and "reset_failure" in p for p in kv["problems"]), kv["problems"]
    assert res.verdict == "FAIL"
    gate = next(g for g in res.gates if g.name == "B4.kv_fault_recovered")
    assert gate.passed is False
    doc = {"verdict": res.verdict, **res.body, "project_targets": None}
    row = judge_m3({"batch": StepEvidence("batch", StepStatus.FAIL, 1.0, "", document=doc, files={})})
    assert row.verdict is GateDecision.NO_GO and row.reason.startswith("KV fault at B4 not recovered: "), row


def test_accept_quick_m3_is_go_on_the_mock_with_the_example_targets(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    r = cli("accept", "--only", "M3", "--targets", EXAMPLE, "--report", out, "--format", "json")
    assert_no_traceback(r)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    m3 = next(row for row in doc["rows"] if row["id"] == "M3")
    assert m3["verdict"] == "GO", m3
    assert m3["key_figure"] == "1 batched profile(s), every lane correct; KV fault recovered; targets met"
    assert doc["targets"]["M3"]["fill_ratio_min"] == 0.6 and doc["targets"]["file"] == str(EXAMPLE)
    assert any(e.startswith("KV fault at B4: recovered") for e in m3["evidence"])
    assert doc["mock_result"] is True
    bench = json.loads((out / "batch" / "bench-report.json").read_text())
    assert bench["kv_fault"]["recovered"] is True
