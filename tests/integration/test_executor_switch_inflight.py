"""A job in flight when the executor mode changes still ends (issue 55: who waits for a job).

In sync the engine's own thread waits for its one job; in async and ping/pong a completion thread does, or the
engine's thread inside the job's end window. A job submitted in sync and still running when an operator switches
to async was waited on by nobody: its request never ended.
"""

from __future__ import annotations

from calctl.serving.config import ExecutorMode
from tests.integration.executor_harness import GOLDEN, _gather, executor_engine
from tests.waiting import wait_until


def test_a_job_submitted_in_sync_ends_after_a_switch_to_async() -> None:
    # time_scale 50: each job runs long enough on the mock for the switch to land while it is in flight
    with executor_engine(ExecutorMode.SYNC, max_inflight=2, time_scale=50.0) as h:
        fut = h.loop.submit(_gather(h.engine, [h.request("switched", 4)]))
        wait_until(lambda: h.worker.inflight() > 0, what="a job in flight", timeout=30.0, interval=0.001)
        assert h.worker.set_executor_mode(ExecutorMode.ASYNC)["ok"]
        (out,) = fut.result(60)  # generous: a hang is what is tested, not speed
        assert out.ok and out.tokens == GOLDEN[:4]


def test_a_job_switched_back_and_forth_is_waited_once_and_ends() -> None:
    with executor_engine(ExecutorMode.SYNC, max_inflight=2, time_scale=50.0) as h:
        fut = h.loop.submit(_gather(h.engine, [h.request("flip", 4)]))
        wait_until(lambda: h.worker.inflight() > 0, what="a job in flight", timeout=30.0, interval=0.001)
        for mode in (ExecutorMode.PINGPONG, ExecutorMode.SYNC, ExecutorMode.ASYNC):
            assert h.worker.set_executor_mode(mode)["ok"]
        (out,) = fut.result(60)
        assert out.ok and out.tokens == GOLDEN[:4]
