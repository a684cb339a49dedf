"""Recovery orderings a loaded host exposes (issue "Verdicts about the device, not the host").

* 001 §11.1: a fault that needs a recovery takes the alias out of Ready *before* any client hears of it; a
  runner that waits for "Ready again" after its request failed must never read the old Ready (the
  fault-isolation scenario reloaded onto a halted chip that way: `cannot configure: chip 0 is faulted`).
* A reload (an unload) on a board whose fault has not been recovered resets the board before it configures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import Health
from calctl.serving.config import ExecutorMode
from calctl.serving.engine.streams import EngineStream
from tests.integration.executor_harness import executor_engine
from tests.waiting import wait_until

DECODE = "model_a_decode"


def test_the_alias_leaves_ready_before_the_client_hears_of_the_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    with executor_engine(ExecutorMode.SYNC, max_inflight=1) as h:
        assert all(o.ok for o in h.run(1, 4, tag="warm"))
        orig_end, orig_rej = EngineStream.post_end, EngineStream.post_rejected

        def post_end(self: EngineStream, event: Any) -> None:
            seen.append((self.request_id, h.worker.is_ready()))
            orig_end(self, event)

        def post_rejected(self: EngineStream, rejection: Any) -> None:
            seen.append((self.request_id, h.worker.is_ready()))
            orig_rej(self, rejection)

        monkeypatch.setattr(EngineStream, "post_end", post_end)
        monkeypatch.setattr(EngineStream, "post_rejected", post_rejected)
        h.rt.arm_fault(FaultRule(FaultKind.CCU_EXCEPTION, at=(3,), graph=DECODE))
        (out,) = h.run(1, 8, tag="fault")
        assert out.error or out.rejected, out
        assert seen and seen[-1] == ("fault-0", False), seen  # not Ready at the moment the failure was posted


def test_a_reload_on_a_halted_board_resets_it_before_configuring() -> None:
    with executor_engine(ExecutorMode.SYNC, max_inflight=1) as h:
        # No reset left in the budget: the fault's recovery fails, the chip stays faulted, the alias Failed.
        h.supervisor.options = dataclasses.replace(h.supervisor.options, max_resets_per_10min=0)
        h.rt.arm_fault(FaultRule(FaultKind.CCU_EXCEPTION, at=(3,), graph=DECODE))
        h.run(1, 8, tag="fault")
        wait_until(lambda: h.supervisor.recoveries, what="the recovery attempt")
        assert h.supervisor.recoveries and not h.supervisor.recoveries[-1].ok, h.supervisor.recoveries
        assert h.rt.health()[0].health is Health.FAULTED
        res = h.supervisor.reload()
        assert res.ok, res
        assert all(c.health is Health.OK for c in h.rt.health())
        assert h.worker.is_ready()
        assert all(o.ok for o in h.run(1, 4, tag="after"))
