"""The model-level runner API the serving engine calls (``run_golden_model``, ``run_warmup_model``) on the
mock board: results, and that the KV sequence and buffers are freed on every path (issue 6)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from calctl.checks.steps import StepTimedOut
from calctl.package.model import Package
from calctl.package.reader import load_manifest
from calctl.runners.golden import GoldenResult, run_golden_model
from calctl.runners.programs import program_digests
from calctl.runners.warmup import run_warmup_model
from calctl.runtime import GenerationId, Health, open_runtime
from calctl.runtime.errors import CcuException
from calctl.runtime.mock import FaultKind, FaultRule, MockRuntime

PACKAGES = Path(__file__).resolve().parents[3] / "fixtures" / "packages"


@pytest.fixture(scope="module")
def combined() -> Package:
    return load_manifest(PACKAGES / "combined")


@pytest.fixture
def rt(combined: Package) -> Iterator[MockRuntime]:
    with open_runtime("mock") as runtime:
        assert isinstance(runtime, MockRuntime)
        with runtime.create_calbin(combined) as calbin:
            runtime.configure(calbin)
            yield runtime
            if runtime.current_calbin is not None:
                runtime.reset_configuration()


def _assert_clean(rt: MockRuntime, pkg: Package) -> None:
    """No job in flight, every KV sequence free again, no buffer left allocated."""
    assert all(c.pending == 0 for c in rt.counters())
    for m in pkg.models:
        assert rt.kv.can_allocate(m.alias, m.kv.max_sequences)
    assert not rt._buffers  # the mock's buffer table (a test of the runner, through the simulator's bookkeeping)


def test_golden_model_passes_and_cleans_up(rt: MockRuntime, combined: Package) -> None:
    for alias in combined.aliases:
        r = run_golden_model(rt, combined, alias, generation=GenerationId(5))
        assert isinstance(r, GoldenResult) and r.ok and r.alias == alias and r.seconds > 0
        assert r.got_tokens == r.expected_tokens and r.topk_agree and r.prefill_allclose
    assert {e.generation for e in rt.trace()} == {5}
    _assert_clean(rt, combined)


def test_timeout_aborts_the_hung_job_keeps_the_configuration_and_cleans_up(rt: MockRuntime, combined: Package) -> None:
    rt.arm_fault(FaultRule(kind=FaultKind.WAIT_TIMEOUT, at=(2,), graph="model_b_decode"))
    with pytest.raises(StepTimedOut) as info:
        run_golden_model(rt, combined, "model-b", step_timeout_s=0.3)
    exc = info.value
    assert exc.exit_code == 4 and exc.step == "decode[1]" and exc.alias == "model-b"
    assert "chip reset of chip 1" in exc.recovery
    assert (
        isinstance(exc.partial, GoldenResult)
        and not exc.partial.ok
        and exc.partial.got_tokens == exc.partial.expected_tokens[:2]
    )
    assert exc.partial.reason == str(exc)
    _assert_clean(rt, combined)
    assert all(h.health is Health.OK for h in rt.health()) and rt.current_calbin is not None
    assert run_golden_model(rt, combined, "model-b").ok  # chip 1 serves again after its reset
    assert run_golden_model(rt, combined, "model-a").ok  # chip 0 was never touched


def test_a_device_error_propagates_and_frees_the_sequence(rt: MockRuntime, combined: Package) -> None:
    rt.arm_fault(FaultRule(kind=FaultKind.CCU_EXCEPTION, at=(3,), graph="model_a_decode"))
    with pytest.raises(CcuException):
        run_golden_model(rt, combined, "model-a")
    assert rt.kv.can_allocate("model-a", combined.model("model-a").kv.max_sequences)
    rt.reset("chip", chip=0)
    _assert_clean(rt, combined)


def test_warmup_model_counts_jobs_per_graph_and_stops_on_a_halted_chip(rt: MockRuntime, combined: Package) -> None:
    w = run_warmup_model(rt, combined, "model-a", iterations=3, decode_steps=4)
    assert w.ok and w.errors == 0 and w.iterations == 3 and w.first_error is None
    assert w.graphs["model_a_prefill"].count == 2 and w.graphs["model_a_decode"].count == 8  # cold iteration excluded
    _assert_clean(rt, combined)
    rt.arm_fault(FaultRule(kind=FaultKind.CCU_EXCEPTION, at=(1,), graph="model_a_prefill"))
    w = run_warmup_model(rt, combined, "model-a", iterations=10, decode_steps=2)
    assert not w.ok and w.errors == 1 and w.iterations == 1
    assert w.first_error is not None and "iteration 0: prefill" in w.first_error and "halted" in w.first_error


def test_a_signal_whose_raise_was_dropped_stops_the_warm_up_at_its_next_iteration(
    rt: MockRuntime, combined: Package
) -> None:
    """A SIGTERM whose raise landed in a GC callback (Python drops it) is still recorded: a 500-iteration warm-up
    before Ready stops at its next iteration instead of running on and serving (``calctl serve`` while loading)."""
    from calctl.errors import Interrupted, note_signal

    note_signal("SIGTERM")
    try:
        with pytest.raises(Interrupted, match="SIGTERM"):
            run_warmup_model(rt, combined, "model-a", iterations=500, decode_steps=2)
    finally:
        note_signal(None)
    _assert_clean(rt, combined)
    assert run_warmup_model(rt, combined, "model-a", iterations=2, decode_steps=2).ok  # forgotten: runs again


def test_program_digests_notice_a_program_changed_after_sealing(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    shutil.copytree(PACKAGES / "single", root)
    pkg = load_manifest(root)
    with open_runtime("mock") as runtime, runtime.create_calbin(pkg) as calbin:
        before = program_digests(calbin)
        assert before and all(p.sealed for p in before) and {p.chip for p in before} == {0}
        victim = root / "model-a" / "prefill" / "ccu1_chip0.elf"
        victim.write_bytes(victim.read_bytes() + b"\0")
        after = {p.file: p.sealed for p in program_digests(calbin)}
    assert after["model-a/prefill/ccu1_chip0.elf"] is False
    assert sum(1 for ok in after.values() if not ok) == 1
