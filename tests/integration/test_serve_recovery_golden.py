"""A recovery whose golden fails for one alias fails that alias only (001 §11.1, §11.2, §11.3).

A fault confined to model A is recovered by a board reset (the default: no session reset allowed), after which
each alias runs its own golden + warm-up (001 §11.2 "分别 golden/warmup"). When model A's golden then gives the
wrong answer, A goes Failed (§11.1 Warming -> Failed: mismatch); model B, whose own golden passed on the same
fresh configuration, goes Ready (§11.3: a numerical mismatch takes out its alias). The supervisor used to fail
every alias of the recovery. A fault of the device itself while a golden runs (a timeout, a CCU exception)
leaves the board's state unknown, so every alias of the recovery still goes Failed (§11.3, last line).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import pytest

from calctl.runtime import open_runtime
from calctl.runtime.mock import MockRuntime
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import ResetScope
from calctl.serving.core.scheduler import JobStatus
from calctl.serving.engine import DeviceSupervisor, SupervisorOptions
from calctl.serving.engine import supervisor as supervisor_module
from calctl.serving.engine.loop import RecoveryRequest
from calctl.signing.policy import make_policy
from tests.conftest import FIXTURE_PACKAGES, TEST_PUB

COMBINED = FIXTURE_PACKAGES / "combined"


@contextmanager
def _served() -> Iterator[tuple[DeviceSupervisor, MockRuntime]]:
    with open_runtime("mock", time_scale=0.0) as opened:
        sup = DeviceSupervisor(
            opened,
            trust=make_policy([TEST_PUB]),
            options=SupervisorOptions(warmup_iterations=1, drain_deadline_s=5.0, max_resets_per_10min=100),
        )
        try:
            sup.start(COMBINED)
            yield sup, cast(MockRuntime, opened)
        finally:
            sup.shutdown(2.0)


def _states(sup: DeviceSupervisor) -> dict[str, str]:
    return {a: w.state.value for a, w in sup.cores.items()}


def test_a_golden_mismatch_after_a_board_reset_fails_only_its_alias() -> None:
    with _served() as (sup, rt):
        # Every model-a decode job from now on "succeeds" with perturbed logits: its golden cannot match.
        rt.arm_fault(FaultRule(FaultKind.CORRUPT_OUTPUT, probability=1.0, graph="model_a_decode", magnitude=50.0))
        rec = sup.recover(RecoveryRequest("model-a", JobStatus.TIMEOUT, "test: a fault confined to model-a", None))
        assert rec.scope == "board" and rec.affected_aliases == ("model-a", "model-b"), rec
        assert _states(sup) == {"model-a": "Failed", "model-b": "Ready"}, (_states(sup), rec)
        assert "model-a" in sup.failures and "golden" in sup.failures["model-a"], sup.failures
        assert "model-b" not in sup.failures
        assert not rec.ok and "model-a" in rec.detail, rec
        # B serves on the fresh generation, A is out of admission.
        assert sup.cores["model-b"].is_ready() and not sup.cores["model-a"].is_ready()
        assert sup.cores["model-b"].generation == max(w.generation for w in sup.cores.values())


def test_a_device_fault_during_a_recovery_golden_fails_every_alias_of_the_recovery() -> None:
    with _served() as (sup, rt):
        # model-a's first decode job after the reset halts its chip: the board's state is unknown again.
        rt.arm_fault(FaultRule(FaultKind.CCU_EXCEPTION, at=(1,), graph="model_a_decode", reset_scope=ResetScope.BOARD))
        rec = sup.recover(RecoveryRequest("model-a", JobStatus.TIMEOUT, "test: a fault confined to model-a", None))
        assert not rec.ok and rec.scope == "board", rec
        assert _states(sup) == {"model-a": "Failed", "model-b": "Failed"}, (_states(sup), rec)


@pytest.mark.parametrize("failing", ["model-a", "model-b"])
def test_the_alias_whose_golden_passed_is_ready_whichever_runs_first(failing: str) -> None:
    with _served() as (sup, rt):
        graph = failing.replace("-", "_") + "_decode"
        rt.arm_fault(FaultRule(FaultKind.CORRUPT_OUTPUT, probability=1.0, graph=graph, magnitude=50.0))
        sup.recover(RecoveryRequest("model-a", JobStatus.TIMEOUT, "test", None))
        other = "model-b" if failing == "model-a" else "model-a"
        assert _states(sup) == {failing: "Failed", other: "Ready"}, _states(sup)


def test_the_lifecycle_history_is_bounded_over_reloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """~10 events a reload used to be kept for good (~3 KB a reload); now the newest, by count and bytes, and a
    reader of one reload's events (``history[h0:]``) still gets exactly those."""
    monkeypatch.setattr(supervisor_module, "HISTORY_ENTRIES", 30)
    with _served() as (sup, _):
        for _ in range(8):
            h0 = len(sup.history)
            assert sup.reload().ok
            states = [(e.alias, e.state) for e in sup.history[h0:]]
            assert ("model-a", "Ready") in states and ("model-b", "Ready") in states, states
        assert sup.history.kept == 30 and len(sup.history) > 60, sup.history
        assert len(list(sup.history)) == 30
