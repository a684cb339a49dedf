"""run-golden runs every compiled decode profile B > 1 against its B1 twins (issue 50: a broken board fails).

A board that decodes B1 right but lets an inactive lane (``lane_valid`` 0) write KV used to pass run-golden,
because every runner ran B1 only. The mock's ``inactive_lane_kv`` fault is that board.
"""

from __future__ import annotations

from pathlib import Path

from calctl.checks.batch_golden import lane_patterns, variant_prompt
from calctl.compiler.bundled import bundled_package
from calctl.report import StepRecord, StepStatus
from calctl.runners.bench.batch import build_batch_sample
from calctl.runners.device import DeviceSpec
from calctl.runners.golden import run_golden
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES


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
        # Both prompts ran; every lane decoded in the batch and sat out gapped steps (finishing at B1).
        assert {lane.prompt for lane in profile.lanes} == {"golden", "variant"}
        steps = len(profile.lanes[0].expected_tokens) - 1
        assert all(0 < lane.batch_steps < steps for lane in profile.lanes)
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
    verdict, models = _golden(FIXTURE_PACKAGES / "combined", DeviceSpec())  # decode profile B1 only
    assert verdict in ("PASS", "WARN")  # the fixture is signed with the test key (SIG002)
    assert [m.batch for m in models] == [(), ()]


def test_the_bundled_combined_sample_runs_b4_on_each_model() -> None:
    """The bundled sample compiles B4 beside B1, so what runs on it with no package (bringup, accept quick's
    batch step for M3) includes a batched profile (issue 53)."""
    verdict, models = _golden(bundled_package("combined"), DeviceSpec())
    assert verdict in ("PASS", "WARN")
    assert [[b.batch for b in m.batch] for m in models] == [[4], [4]]
    assert all(b.ok for m in models for b in m.batch)


def test_the_variant_prompt_differs_in_every_token() -> None:
    prompt = (0, 5, 383)
    assert variant_prompt(prompt, 384) == (1, 6, 0)


def _combined_with_batches(tmp_path: Path) -> Path:
    from calctl.compiler.sample import build_sample
    from calctl.signing.keys import load_private
    from calctl.signing.policy import test_key_paths

    return build_sample(
        tmp_path / "combined", kind="combined", key=load_private(test_key_paths()[0]), decode_profiles=(1, 4)
    )


def test_poc_runs_both_models_batch_profiles_at_once_and_fails_an_inactive_lane_that_writes_kv(tmp_path: Path) -> None:
    from calctl.runners.poc import run_poc_combined

    pkg = _combined_with_batches(tmp_path)
    trust = make_policy(None, False, trust_test_key=True)
    expect = ("model-a", "model-b")
    healthy = run_poc_combined(pkg, trust=trust, device=DeviceSpec(), expect_models=expect, rounds=2)
    step = next(s for s in healthy.steps or () if s.name == "batch profiles")
    assert isinstance(step, StepRecord)
    assert step.status is StepStatus.PASS and "model-a: B4; model-b: B4" in step.detail, step
    assert [r.batch for r in healthy.body["batch_profiles"]["model-b"]] == [4]

    plan = _plan(tmp_path, "  - kind: inactive_lane_kv\n    graph: model_b_decode\n    probability: 1.0\n")
    broken = run_poc_combined(pkg, trust=trust, device=DeviceSpec(fault_plan=plan), expect_models=expect, rounds=2)
    assert broken.verdict == "FAIL" and broken.exit_code == 1
    assert "model-b: B4 lane " in (broken.error or ""), broken.error


def test_lane_patterns_leave_a_gap_below_an_active_lane_in_a_seeded_order() -> None:
    """A board that packs the active lanes' logits into the first rows answers any pattern 0..k-1 right: every
    pattern has an active lane above an inactive one."""
    for lanes in (2, 3, 4, 8):
        patterns = lane_patterns(lanes, seed=1)
        assert patterns and len(set(patterns)) == len(patterns)
        for p in patterns:
            assert all(0 <= lane < lanes for lane in p)
            assert any(lane > 0 and lane - 1 not in p for lane in p), p
    assert (3,) in lane_patterns(4) and (0, 2) in lane_patterns(4) and (1, 3) in lane_patterns(4)
    assert lane_patterns(8, seed=7) == lane_patterns(8, seed=7)
    assert len({lane_patterns(8, seed=s) for s in range(8)}) > 1  # the seed orders them
    assert lane_patterns(1) == ()
