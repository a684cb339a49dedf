"""run-golden runs every compiled decode profile B > 1 against its B1 twins (issue 50: a broken board fails).

A board that decodes B1 right but lets an inactive lane (``lane_valid`` 0) write KV used to pass run-golden,
because every runner ran B1 only. The mock's ``inactive_lane_kv`` fault is that board.
"""

from __future__ import annotations

from pathlib import Path

from calctl.checks.batch_golden import variant_prompt
from calctl.compiler.bundled import bundled_package
from calctl.runners.bench.batch import build_batch_sample
from calctl.runners.device import DeviceSpec
from calctl.runners.golden import run_golden
from calctl.signing.policy import make_policy


def _plan(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(f"schema: calctl-fault-plan/v1\nfaults:\n{body}", encoding="utf-8")
    return path


def _golden(pkg: Path, device: DeviceSpec) -> tuple[str, list]:
    report = run_golden(pkg, trust=make_policy(None, False, trust_test_key=True), device=device)
    return report.verdict, list(report.body["models"])


def test_every_batch_profile_matches_its_b1_twins_on_a_healthy_board(tmp_path: Path) -> None:
    pkg = build_batch_sample(tmp_path / "pkg")  # decode profiles 1, 4, 8, 16
    verdict, models = _golden(pkg, DeviceSpec())
    assert verdict == "WARN"  # signed with the published test key (SIG002); the checks themselves pass
    (model,) = models
    assert model.ok
    assert [b.batch for b in model.batch] == [4, 8, 16]
    for profile in model.batch:
        assert profile.ok and profile.reason is None
        assert len(profile.lanes) == profile.batch
        # Both prompts ran, the upper half of the lanes went inactive mid-run and finished at B1.
        assert {lane.prompt for lane in profile.lanes} == {"golden", "variant"}
        steps = len(profile.lanes[0].expected_tokens) - 1
        assert all(lane.batch_steps == steps for lane in profile.lanes[: profile.batch // 2])
        assert all(0 < lane.batch_steps < steps for lane in profile.lanes[profile.batch // 2 :])
        assert all(lane.got_tokens == lane.expected_tokens for lane in profile.lanes)
    golden_lane = model.batch[0].lanes[0]
    assert golden_lane.expected_tokens == model.expected_tokens  # the golden twin is the package's golden


def test_an_inactive_lane_that_writes_kv_fails_naming_profile_and_lane(tmp_path: Path) -> None:
    pkg = build_batch_sample(tmp_path / "pkg")
    plan = _plan(tmp_path, "  - kind: inactive_lane_kv\n    graph: model_a_decode\n    probability: 1.0\n")
    verdict, models = _golden(pkg, DeviceSpec(fault_plan=plan))
    assert verdict == "FAIL"
    (model,) = models
    assert model.first_mismatch is None  # B1 is right: only the batch shows the fault
    assert model.reason.startswith("model-a: B4 lane ") and "expected" in model.reason, model.reason
    failed = next(b for b in model.batch if not b.ok)
    assert failed.batch == 4 and any(lane.first_mismatch is not None for lane in failed.lanes)


def test_a_b1_only_package_runs_no_batch() -> None:
    verdict, models = _golden(bundled_package("combined"), DeviceSpec())
    assert verdict in ("PASS", "WARN")  # the bundled sample is signed with the test key (SIG002)
    assert [m.batch for m in models] == [(), ()]


def test_the_variant_prompt_differs_in_every_token() -> None:
    prompt = (0, 5, 383)
    assert variant_prompt(prompt, 384) == (1, 6, 0)
