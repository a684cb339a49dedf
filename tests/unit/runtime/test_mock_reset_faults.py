"""The mock's reset faults that only a check after the reset can see (docs/runtime.md §4).

``reset_chip_lost``: the reset returns OK and a chip it reset stays down (tenstorrent/tt-umd#2316).
``reset_takes_other_chip``: a chip reset returns OK, its chip comes back, another goes down (Xilinx/video-sdk#8).
"""

from __future__ import annotations

import pytest

from calctl.errors import ConfigError
from calctl.runtime.errors import DeviceLost, JobAborted
from calctl.runtime.mock import FaultKind, FaultPlan, FaultRule, open_mock
from calctl.runtime.types import Health
from tests.unit.runtime.runtime_helpers import package, prefill_job


def test_a_chip_lost_by_a_reset_stays_down_after_the_reset_returned_ok() -> None:
    plan = FaultPlan(rules=(FaultRule(kind=FaultKind.RESET_CHIP_LOST, at=(1,), chip=1),))
    pkg = package("combined")
    with open_mock(fault_plan=plan) as rt:
        rt.reset("board")  # returns: the runtime says the reset worked
        health = {h.chip: h for h in rt.health()}
        assert health[0].health is Health.OK
        assert health[1].health is Health.FAULTED and "did not come back after the board reset" in str(health[1].detail)
        with pytest.raises(DeviceLost, match="chip 1"):  # a chip reset cannot bring it back: it needs the board
            rt.reset("chip", chip=1)
        rt.reset("board")  # the second reset is not in the rule's ordinals: the chip comes back
        assert {h.health for h in rt.health()} == {Health.OK}
        rt.configure(rt.create_calbin(pkg))
        rt.wait(prefill_job(rt, pkg, "model-b")[0], 10)
        assert [(f.kind, f.ordinal, f.chips) for f in rt.injected_faults()] == [(FaultKind.RESET_CHIP_LOST, 1, (0, 1))]


def test_a_chip_reset_that_takes_the_other_chip_down_aborts_its_jobs() -> None:
    plan = FaultPlan(rules=(FaultRule(kind=FaultKind.RESET_TAKES_OTHER_CHIP, at=(1,)),))
    pkg = package("combined")
    with open_mock(fault_plan=plan, time_scale=1000.0) as rt:  # seconds-long jobs: in flight at the reset
        rt.reset("board")  # a board reset leaves no other chip: not an event of the rule
        rt.configure(rt.create_calbin(pkg))
        job_b = prefill_job(rt, pkg, "model-b")[0]  # on chip 1, still in flight at the reset
        rt.reset("chip", chip=0)
        health = {h.chip: h for h in rt.health()}
        assert health[0].health is Health.OK
        assert health[1].health is Health.FAULTED and "went down with the chip 0 reset" in str(health[1].detail)
        with pytest.raises(JobAborted):
            rt.wait(job_b, 10)
        with pytest.raises(DeviceLost, match="chip 1 is halted"):
            prefill_job(rt, pkg, "model-b")
        rt.reset("chip", chip=1)  # its own chip reset brings it back
        assert {h.health for h in rt.health()} == {Health.OK}
        [fault] = rt.injected_faults()
        assert (fault.kind, fault.ordinal, fault.chips) == (FaultKind.RESET_TAKES_OTHER_CHIP, 1, (0,))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"kind": "reset_chip_lost", "job": 1}, "fires on resets; use 'reset', not 'job'"),
        ({"kind": "reset_takes_other_chip", "reset": 1, "model": "model-a"}, "reset_takes_other_chip is per reset"),
        ({"kind": "reset_chip_lost", "reset": 1, "graph": "g"}, "reset_chip_lost is per reset"),
        ({"kind": "reset_chip_lost", "reset": 1, "reset_scope": "board"}, "reset_scope applies only"),
    ],
)
def test_bad_reset_fault_rules_are_refused(rule: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FaultPlan.from_document({"schema": "calctl-fault-plan/v1", "faults": [rule]}, source="plan.yaml")


def test_the_reset_faults_fire_on_resets_only() -> None:
    assert {k for k in FaultKind if k.on_reset} == {
        FaultKind.RESET_FAILURE,
        FaultKind.RESET_CHIP_LOST,
        FaultKind.RESET_TAKES_OTHER_CHIP,
    }
