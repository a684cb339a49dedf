"""Issue 19, "Requests" last bullet (001 §10.4 "a mismatch fails at start-up"): the dual-model config's
``device.combined_calbin`` must name the package being served, its digest can be pinned (config or
``--pin-digest``), and a standalone ``calculet-scheduler/v1`` file is accepted by ``calctl serve``."""

from __future__ import annotations

from pathlib import Path

import pytest

from calctl.errors import ConfigError, UsageError
from calctl.package.info import package_digest
from calctl.runtime import open_runtime
from calctl.serving.config import ConfigFieldError, load_dual_model_config, load_scheduler_config
from calctl.serving.engine import DeviceSupervisor, SupervisorOptions
from calctl.serving.engine.options import LoadPolicy
from calctl.serving.launch import load_scheduler_files
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB, Cli, assert_no_traceback
from tests.integration.serve_harness import COMBINED, dual_config

SINGLE = FIXTURE_PACKAGES / "single"

SCHEDULER = """\
schema: calculet-scheduler/v1
model_alias: {alias}
admission: {{max_waiting_requests: 7, max_waiting_prompt_tokens: 262144, deadline_default_ms: 120000}}
queues:
  decode_weight: 8
  short_prefill_weight: 4
  medium_prefill_weight: 2
  long_prefill_weight: 1
  short_prefill_max_tokens: 512
  medium_prefill_max_tokens: 4096
  long_prefill_max_waiting: 3
batch: {{profiles: [1], batching_window_us: 0, step_estimate_floor_us: 1500}}
executor: {{max_inflight: 1, fixed_engine: false}}
recovery: {{max_resets_per_10min: 2, restart_on_unknown_dma: true}}
"""


def _supervisor(rt, **kw) -> DeviceSupervisor:
    return DeviceSupervisor(rt, trust=make_policy([TEST_PUB]), options=SupervisorOptions(warmup_iterations=0), **kw)


def test_a_config_naming_another_package_fails_at_start_up(tmp_path: Path) -> None:
    """Before: a config whose combined_calbin named another path still served. Now nothing is configured."""
    cfg = load_dual_model_config(dual_config(tmp_path, pkg=tmp_path / "dual-a-b"))
    with open_runtime("mock") as rt:
        sup = _supervisor(rt, dual_config=cfg)
        try:
            with pytest.raises(ConfigFieldError) as exc:
                sup.start(COMBINED)
            assert not sup.cores and sup.loaded is None
        finally:
            sup.shutdown(1.0)
    msg = str(exc.value)
    assert "dual.yaml: /device/combined_calbin: names" in msg and str(tmp_path / "dual-a-b") in msg
    assert str(COMBINED.resolve()) in msg


def test_a_relative_combined_calbin_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "pkgs").symlink_to(COMBINED.parent)
    path = dual_config(tmp_path)
    path.write_text(path.read_text().replace(f"combined_calbin: {COMBINED}", "combined_calbin: pkgs/combined"))
    with open_runtime("mock") as rt:
        sup = _supervisor(rt, dual_config=load_dual_model_config(path))
        try:
            sup.start(COMBINED)  # the same directory through a symlink: accepted
            assert set(sup.cores) == {"model-a", "model-b"}
        finally:
            sup.shutdown(1.0)


def test_the_package_digest_can_be_pinned(tmp_path: Path) -> None:
    digest = package_digest(COMBINED)
    assert digest is not None
    other = "0" * 64
    path = dual_config(tmp_path)
    path.write_text(path.read_text().replace("expected_chips: 2,", f"expected_chips: 2, package_digest: '{other}',"))
    with open_runtime("mock") as rt:
        sup = _supervisor(rt, dual_config=load_dual_model_config(path))
        try:
            with pytest.raises(
                ConfigFieldError, match=f"/device/package_digest: pins {other}, but the package's digest is {digest}"
            ):
                sup.start(COMBINED)
        finally:
            sup.shutdown(1.0)
        sup = _supervisor(rt, load_policy=LoadPolicy(pinned_digest=other))
        try:
            with pytest.raises(ConfigError, match=f"--pin-digest .* has digest {digest}"):
                sup.start(COMBINED)
        finally:
            sup.shutdown(1.0)
        sup = _supervisor(rt, load_policy=LoadPolicy(pinned_digest=digest))
        try:
            sup.start(COMBINED)
            assert sup.loaded is not None and sup.loaded.digest == digest
        finally:
            sup.shutdown(1.0)


def test_a_standalone_scheduler_file_configures_its_alias(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(SCHEDULER.format(alias="model-a"))
    cfgs = load_scheduler_files((tmp_path / "a.yaml",))
    with open_runtime("mock") as rt:
        sup = _supervisor(rt, scheduler_configs=cfgs)
        try:
            sup.start(SINGLE)
            settings = sup.cores["model-a"]._sched.settings
        finally:
            sup.shutdown(1.0)
    assert settings.budget.max_waiting_requests == 7
    assert settings.long_prefill.max_waiting == 3 and settings.decode.step_estimate_s == pytest.approx(0.0015)


def test_a_scheduler_file_for_an_alias_the_package_lacks_fails_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text(SCHEDULER.format(alias="model-x"))
    with open_runtime("mock") as rt:
        sup = _supervisor(rt, scheduler_configs={"model-x": load_scheduler_config(tmp_path / "x.yaml")})
        try:
            with pytest.raises(ConfigFieldError, match="/model_alias: 'model-x' is not a model of the package"):
                sup.start(SINGLE)
        finally:
            sup.shutdown(1.0)


def test_two_scheduler_files_for_one_alias_are_a_usage_error(tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(SCHEDULER.format(alias="model-a"))
    with pytest.raises(UsageError, match=r"b\.yaml: model_alias 'model-a' is already configured by .*a\.yaml"):
        load_scheduler_files((tmp_path / "a.yaml", tmp_path / "b.yaml"))


def test_serve_cli_mismatches_exit_2_with_the_field(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALCTL_CACHE_DIR", str(tmp_path / "cache"))
    base = ("serve", COMBINED, "--trusted-key", TEST_PUB, "--port", "0", "--warmup-iterations", "0")
    r = cli(*base, "--config", dual_config(tmp_path, pkg=tmp_path / "elsewhere"))
    assert_no_traceback(r)
    assert r.code == 2 and "/device/combined_calbin: names" in r.err, r.err
    r = cli(*base, "--pin-digest", "1" * 64)
    assert_no_traceback(r)
    assert r.code == 2 and "--pin-digest " + "1" * 64 in r.err, r.err
    r = cli(*base, "--pin-digest", "not-a-digest")
    assert_no_traceback(r)
    assert r.code == 2 and "expected 64 hex digits" in r.err, r.err
    (tmp_path / "x.yaml").write_text(SCHEDULER.format(alias="model-x"))
    r = cli(*base, "--scheduler-config", tmp_path / "x.yaml")
    assert_no_traceback(r)
    assert r.code == 2 and "x.yaml: /model_alias: 'model-x' is not a model of the package" in r.err, r.err
