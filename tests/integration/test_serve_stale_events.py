"""Events announced before a reset retired the generation and delivered after it (issue 26, 000 §9.2, 001 §11.3).

The engine loop defers a finished job's events to the end of its step (``EngineCore._pending``); a supervisor
command drained in the same step runs first. e966e41 voided a KV release delivered that way; this is the same
interleaving for a recovery request: a job of generation g failed (RecoveryNeeded deferred), the supervisor retired
g for a reset (of the other alias's fault, or a reload) before the loop delivered it. The command here runs on the
loop thread and does both in that order, so the interleaving is forced, not waited for.
"""

from __future__ import annotations

from calctl.runtime.errors import RuntimeStatus
from calctl.serving.config import ExecutorMode
from calctl.serving.core.admission import ModelState
from calctl.serving.core.ids import JobId, ModelGenerationId
from calctl.serving.core.scheduler import JobStatus, RecoveryNeeded
from calctl.serving.engine.loop import RecoveryRequest
from tests.integration.executor_harness import executor_engine


def test_a_recovery_announced_before_a_reset_and_delivered_after_it_is_void() -> None:
    with executor_engine(ExecutorMode.SYNC, max_inflight=1, time_scale=0.0) as h:
        w = h.worker
        asked: list[RecoveryRequest] = []
        w._on_recovery = asked.append  # what the supervisor's recovery queue would get
        gen = ModelGenerationId(w.generation)
        ev = RecoveryNeeded(gen, JobId(10_001), JobStatus.FAULT, "JOB_ABORTED: aborted by board reset", ())
        w.set_state(ModelState.RECOVERING)  # the supervisor's _stop_and_drain, before it retires

        def job_done_then_retired() -> None:
            w._pending.append(([ev], RuntimeStatus.JOB_ABORTED, gen))  # _job_done(defer=True) of a step
            w.retire("board reset for model-b")  # the retire command drained in the same step, first

        w._call(job_done_then_retired)  # the loop delivers the deferred events after the command
        assert asked == [], "a second recovery for the generation the reset already retired"
        assert w.state is ModelState.RECOVERING  # not shown Draining in the middle of the supervisor's recovery
        assert not w.life.recovery_pending

        # Control: the same event while a generation is served does ask, for the job's generation.
        w.forget_device_state()
        w.publish(h.rt, int(gen) + 1)
        ev2 = RecoveryNeeded(ModelGenerationId(int(gen) + 1), JobId(10_002), JobStatus.FAULT, "CCU_EXCEPTION", ())
        w._call(lambda: w._pending.append(([ev2], RuntimeStatus.CCU_EXCEPTION, ModelGenerationId(int(gen) + 1))))
        assert [(r.alias, r.generation) for r in asked] == [("model-a", int(gen) + 1)]
        assert w.state is ModelState.DRAINING
        w.retire("test over")
