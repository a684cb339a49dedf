"""000 §19 M3 against the project's targets (``calctl accept --targets FILE``) and the batched KV fault.

M3 is GO only with every lane correct, the project's fill-ratio / throughput-gain / P99 targets met and the KV
fault recovered; NO-GO naming the figure and its target (or what the recovery did wrong); NOT MEASURED without
a targets file, saying so and naming ``--targets FILE`` (calctl sets no target of its own), or when the KV
fault could not be injected (a board). The targets file is refused (exit 2) naming file, field and value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calctl.errors import ConfigError, ExitCode
from calctl.report import StepStatus
from calctl.runners.acceptance.milestones import judge_m3
from calctl.runners.acceptance.rows import GateDecision, StepEvidence
from calctl.runners.acceptance.targets import ProjectTargets
from tests.conftest import Cli

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "accept-targets.yaml"


def profile(b: int, fill: float, device_tput: float, p99: tuple[float, float, float]) -> dict[str, Any]:
    mean, lo, hi = p99
    return {
        "profile": f"B{b}",
        "batch": b,
        "requests": 16,
        "errors": 0,
        "fill_ratio": fill,
        "throughput_tokens_per_s": device_tput,
        "lanes_match_b1": True,
        "itl_p99_s": {"mean": mean, "ci_low": lo, "ci_high": hi, "n": 240, "clock": "device"},
        **({} if b == 1 else {"gain_vs_b1": {"clock": "device", "gain": device_tput / 70.0, "host_gain": 2.0}}),
    }


B1 = profile(1, 1.0, 70.0, (0.020, 0.015, 0.025))
B4 = profile(4, 0.80, 175.0, (0.037, 0.036, 0.038))
RECOVERED = {"measured": True, "profile": "B4", "recovered": True, "problems": [], "summary": "recovered (...)"}
BROKEN = {
    "measured": True,
    "profile": "B4",
    "recovered": False,
    "problems": ["recovery failed: board reset failed (injected reset_failure)"],
    "summary": "NOT recovered (...)",
}
NOT_ON_BOARD = {
    "measured": False,
    "recovered": None,
    "reason": "KV-fault recovery on a batched profile needs fault injection, which only the mock board has",
    "how_to_measure": "inject a CCU fault with the vendor's tools",
    "summary": "not measured",
}


def targets(fill: float = 0.5, gain: float = 1.2, p99: float = 5.0) -> dict[str, Any]:
    m3 = {"fill_ratio_min": fill, "throughput_gain_min": gain, "p99_itl_regression_max": p99}
    doc = {"schema": "calctl-accept-targets/v1", "M3": m3}
    return ProjectTargets.from_document(doc, source="t.yaml").to_dict()


def batch_step(kv: dict[str, Any] | None, project_targets: dict[str, Any] | None, *, b4: Any = B4) -> dict[str, Any]:
    doc = {"verdict": "PASS", "profiles": [B1, b4], "kv_fault": kv, "project_targets": project_targets}
    ev = StepEvidence("batch", StepStatus.PASS, 1.0, "ran", document=doc, files={"report": "batch/bench-report.json"})
    return {"batch": ev}


def test_m3_is_go_with_every_lane_right_targets_met_and_the_kv_fault_recovered() -> None:
    r = judge_m3(batch_step(RECOVERED, targets()))
    assert r.verdict is GateDecision.GO, r
    assert r.key_figure.endswith("KV fault recovered; targets met")
    assert any("B4 fill ratio: 0.80 (target >= 0.5, fill_ratio_min)" in e for e in r.evidence)
    assert any("throughput_gain_min" in e for e in r.evidence) and any(
        "p99_itl_regression_max" in e for e in r.evidence
    )
    assert r.data["targets"]["file"] == "t.yaml" and len(r.data["checks"]) == 3


def test_an_unreachable_fill_ratio_target_is_no_go_naming_it() -> None:
    r = judge_m3(batch_step(RECOVERED, targets(fill=0.95)))
    assert r.verdict is GateDecision.NO_GO, r
    assert "B4 fill ratio 0.80 (target >= 0.95, fill_ratio_min)" in r.reason
    assert "continuous batching" in r.action and "targets NOT met" in r.key_figure


def test_a_p99_over_the_target_is_no_go_and_a_straddling_one_not_measured() -> None:
    over = judge_m3(batch_step(RECOVERED, targets(p99=0.2)))  # limit 24 ms; the B4 CI [36, 38] ms lies above
    assert over.verdict is GateDecision.NO_GO and "B4 P99 inter-token latency" in over.reason, over
    assert "p99_itl_regression_max" in over.reason
    wide = profile(4, 0.80, 175.0, (0.037, 0.030, 0.060))  # limit 40 ms inside [30, 60] ms
    unsure = judge_m3(batch_step(RECOVERED, targets(p99=1.0), b4=wide))
    assert unsure.verdict is GateDecision.NOT_MEASURED and "straddles" in unsure.reason, unsure


def test_without_targets_m3_is_not_measured_naming_the_option() -> None:
    r = judge_m3(batch_step(RECOVERED, None))
    assert r.verdict is GateDecision.NOT_MEASURED, r
    assert "KV fault recovered" in r.reason
    assert "the project has set no fill-ratio / throughput / P99 target" in r.reason
    assert "calctl sets none of its own" in r.reason
    assert r.how_to_measure.startswith("`calctl accept PKG --targets FILE`") and "docs/accept.md" in r.how_to_measure


def test_a_kv_fault_not_recovered_is_no_go_with_or_without_targets() -> None:
    for t in (None, targets()):
        r = judge_m3(batch_step(BROKEN, t))
        assert r.verdict is GateDecision.NO_GO, r
        assert r.reason.startswith("KV fault at B4 not recovered: recovery failed: board reset failed"), r.reason
        assert "KV fault NOT recovered" in r.key_figure


def test_a_kv_fault_that_could_not_be_injected_is_not_measured() -> None:
    r = judge_m3(batch_step(NOT_ON_BOARD, targets()))
    assert r.verdict is GateDecision.NOT_MEASURED, r
    assert "targets met; KV-fault recovery not measured" in r.reason and "fault injection" in r.reason
    assert r.how_to_measure == "inject a CCU fault with the vendor's tools"


def test_the_example_targets_file_loads() -> None:
    t = ProjectTargets.load(EXAMPLE)
    assert t.m3.fill_ratio_min == 0.6 and t.m3.throughput_gain_min == 1.5 and t.m3.p99_itl_regression_max == 3.0


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("M3: {fill_ratio_min: 1.5, throughput_gain_min: 1.5, p99_itl_regression_max: 1}", "/M3/fill_ratio_min: 1.5"),
        ("M3: {fill_ratio_min: 0.5, throughput_gain_min: 0, p99_itl_regression_max: 1}", "/M3/throughput_gain_min: 0"),
        ("M3: {fill_ratio_min: 0.5, throughput_gain_min: 2}", "'p99_itl_regression_max' is a required property"),
        ("M3: {fill_ratio_min: 0.5, throughput_gain_min: 2, p99_itl_regression_max: -1}", "/M3/p99_itl_regression_max"),
        ("M3: {fill_ratio_min: '0.5', throughput_gain_min: 2, p99_itl_regression_max: 1}", "'0.5' is not of type"),
        ("M3: {fill_ratio_min: .nan, throughput_gain_min: 2, p99_itl_regression_max: 1}", "non-finite"),
        ("m3: {}", "'M3' is a required property"),
    ],
)
def test_a_bad_targets_file_is_refused_naming_file_field_and_value(tmp_path: Path, body: str, said: str) -> None:
    f = tmp_path / "targets.yaml"
    f.write_text(f"schema: calctl-accept-targets/v1\n{body}\n")
    with pytest.raises(ConfigError) as exc:
        ProjectTargets.load(f)
    assert str(f) in str(exc.value) and said in str(exc.value), str(exc.value)


def test_accept_refuses_a_bad_targets_file_before_anything_runs(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "targets.yaml"
    f.write_text(
        "schema: calctl-accept-targets/v1\nM3: {fill_ratio_min: 2, throughput_gain_min: 1, p99_itl_regression_max: 1}\n"
    )
    out = tmp_path / "rep"
    r = cli("accept", "--targets", f, "--report", out)
    assert r.code == int(ExitCode.USAGE), r.err
    assert f"--targets {f}: /M3/fill_ratio_min: 2 is greater than the maximum of 1" in r.err.replace("\n", " ")
    assert "Traceback" not in r.err and not out.exists()
    missing = cli("accept", "--targets", tmp_path / "nope.yaml", "--report", out)
    assert missing.code == int(ExitCode.USAGE) and "cannot read the targets file" in missing.err
