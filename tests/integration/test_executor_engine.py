"""Executor modes of the engine core on the mock board (000 §14, §15): what each mode submits, what the monitor reacts to,
and that going back to ping/pong is an operator action. The engine is real (supervisor, engine core, mock);
time scales are small, and nothing here asserts a duration."""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest

from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import ChipCounters, Engine, JobId, JobPhase, JobState, TraceEvent
from calctl.serving.config import DowngradePolicy, ExecutorMode
from tests.integration.executor_harness import GOLDEN, Harness, executor_engine
from tests.waiting import wait_until

DECODE = "model_a_decode"


def _jobs(h: Harness, since: int) -> list[TraceEvent]:
    return sorted((e for e in h.rt.trace(since_ns=since) if e.model == "model-a"), key=lambda e: e.submit_ns)


def _max_in_flight(events: list[TraceEvent]) -> int:
    points = sorted([(e.start_ns, 1) for e in events if e.start_ns] + [(e.end_ns, -1) for e in events if e.end_ns])
    level = best = 0
    for _, d in points:
        level += d
        best = max(best, level)
    return best


@pytest.mark.parametrize("mode", list(ExecutorMode))
def test_each_mode_serves_the_golden_tokens_with_its_own_engine_choice(mode: ExecutorMode) -> None:
    with executor_engine(mode, time_scale=1.0) as h:
        since = time.monotonic_ns()
        outs = h.run(3)
        assert all(o.ok and o.tokens == GOLDEN for o in outs), outs
        jobs = _jobs(h, since)
        engines = {e.engine for e in jobs}
        if mode is ExecutorMode.PINGPONG:
            assert engines == {Engine.PING, Engine.PONG}
            assert _max_in_flight(jobs) == 2  # two in flight ...
            computes = sorted(
                (p.start_ns, p.end_ns) for e in jobs for p in e.phases or () if p.phase is JobPhase.COMPUTE
            )
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(computes))  # ... never two computing
        else:
            assert engines == {Engine.AUTO} and _max_in_flight(jobs) == 1
        assert h.metric("calctl_executor_mode", model="model-a", mode=mode.value) == 1.0
        assert h.worker.executor_status()["downgrades"] == []


def test_fixed_engine_sends_one_in_flight_jobs_to_ping() -> None:
    with executor_engine(ExecutorMode.SYNC, max_inflight=1, fixed_engine=True, time_scale=0.5) as h:
        since = time.monotonic_ns()
        assert all(o.ok for o in h.run(2, 4))
        assert {e.engine for e in _jobs(h, since)} == {Engine.PING}


def test_status_anomaly_downgrades_and_the_job_is_not_trusted() -> None:
    with executor_engine(time_scale=1.0) as h:
        real_query = h.rt.query
        armed = {"left": 1}

        def lying_query(job):
            res = real_query(job)
            if job.graph == DECODE and res.state.terminal and armed["left"]:
                armed["left"] -= 1
                return dataclasses.replace(res, job=dataclasses.replace(res.job, id=JobId(res.job.id + 10_000)))
            return res

        h.rt.query = lying_query  # type: ignore[method-assign]
        outs = h.run(3)
        assert all(o.delivered_right() for o in outs)  # the lied-about job's token was never delivered
        assert sum(not o.ok for o in outs) >= 1
        (d,) = h.worker.downgrades()
        assert d.reason.value == "status_anomaly" and "answered for job" in d.detail
        assert h.worker.executor_mode is ExecutorMode.ASYNC


def test_pending_counter_that_never_closes_downgrades() -> None:
    policy = DowngradePolicy(pending_grace_s=0.3)
    with executor_engine(time_scale=0.5, downgrade=policy) as h:
        assert all(o.ok for o in h.run(2, 4))
        h.rt.counters = lambda: (ChipCounters(0, 3, 100, 0), ChipCounters(1, 0, 0, 0))  # type: ignore[method-assign]
        (d,) = wait_until(h.worker.downgrades, what="the counter anomaly's downgrade", timeout=5, interval=0.05)
        assert d.reason.value == "counter_anomaly" and "pending counter stays at 3" in d.detail


def test_p99_regression_against_a_configured_baseline_downgrades_without_dropping() -> None:
    policy = DowngradePolicy(p99_baseline_s=1e-6, p99_window=10, p99_min_samples=10)  # no real run beats 1 µs
    with executor_engine(time_scale=0.5, downgrade=policy) as h:
        outs = h.run(3)
        assert all(o.ok and o.tokens == GOLDEN for o in outs)  # the downgrade drains; nothing is lost
        (d,) = h.worker.downgrades()
        assert d.reason.value == "p99_regression"
        assert h.metric("calctl_executor_downgrades_total", model="model-a", reason="p99_regression") == 1.0


def test_a_hung_job_downgrades_and_the_job_running_beside_it_drains() -> None:
    with executor_engine(time_scale=2.0, job_timeout_s=0.6) as h:
        h.run(2, 4, tag="warm")
        since = time.monotonic_ns()
        h.rt.arm_fault(FaultRule(FaultKind.WAIT_TIMEOUT, at=(6,), graph=DECODE))
        outs = h.run(3)
        _wait_ready(h)  # the reset is over: the hung job (and anything it aborted) is in the trace
        assert all(o.delivered_right() for o in outs)
        (d,) = h.worker.downgrades()
        assert d.reason.value == "consecutive_timeouts"
        jobs = {e.job: e for e in _jobs(h, since)}
        (fault,) = h.rt.injected_faults()
        assert fault.job is not None, fault
        hung = jobs[JobId(fault.job)]
        assert hung.start_ns is not None
        # Every job that had started beside the hung one (on the other bank, when the host submitted it in
        # time) completed before the reset; a job queued behind the hung chip never started (a hung chip runs
        # nothing) and the reset ended it, never a job that had started. Whether a sibling overlapped the hung
        # job's start depends on how fast the host submitted it, so the overlap itself is not asserted.
        started = [e for e in jobs.values() if e is not hung and e.start_ns]
        assert started and all(e.state is JobState.SUCCEEDED for e in started)
        assert all(e.start_ns is None for e in jobs.values() if e.state is JobState.ABORTED and e is not hung)
        assert h.worker.executor_mode is ExecutorMode.ASYNC  # recovery never re-enables ping/pong
        assert all(o.ok and o.tokens == GOLDEN for o in h.run(2, tag="after"))


def test_a_ccu_fault_in_pingpong_is_an_uncertain_recovery() -> None:
    with executor_engine(time_scale=1.0) as h:
        h.rt.arm_fault(FaultRule(FaultKind.CCU_EXCEPTION, at=(5,), graph=DECODE))
        outs = h.run(3)
        assert all(o.delivered_right() for o in outs)
        (d,) = h.worker.downgrades()
        assert d.reason.value == "uncertain_recovery"
        # The recovery runs on the supervisor's thread: the core may still read Ready before it starts.
        wait_until(lambda: len(h.supervisor.recoveries) == 1, what="the recovery to be recorded")
        _wait_ready(h)
        assert len(h.supervisor.recoveries) == 1 and h.supervisor.recoveries[0].ok


def test_only_an_operator_goes_back_to_pingpong_within_the_configured_ceiling() -> None:
    with executor_engine(time_scale=0.5, downgrade=DowngradePolicy(consecutive_busy=1)) as h:
        h.rt.arm_fault(FaultRule(FaultKind.DEVICE_BUSY, at=(3,), graph=DECODE))
        assert all(o.ok and o.tokens == GOLDEN for o in h.run(2))
        assert h.worker.executor_mode is ExecutorMode.ASYNC
        assert all(o.ok for o in h.run(2, tag="still"))
        assert h.worker.executor_mode is ExecutorMode.ASYNC  # clean traffic does not bring ping/pong back
        out = h.worker.set_executor_mode(ExecutorMode.PINGPONG)
        assert out["ok"] and out["mode"] == "pingpong" and out["previous_mode"] == "async"
        assert [(c["from"], c["to"]) for c in out["operator_changes"]] == [("async", "pingpong")], out
        since = time.monotonic_ns()
        assert all(o.ok and o.tokens == GOLDEN for o in h.run(3, tag="again"))
        assert {e.engine for e in _jobs(h, since)} == {Engine.PING, Engine.PONG}
        assert len(h.worker.downgrades()) == 1  # an operator change is not a downgrade
    with executor_engine(ExecutorMode.ASYNC, max_inflight=1, time_scale=0.5) as h:
        out = h.worker.set_executor_mode(ExecutorMode.PINGPONG)
        assert not out["ok"] and "max_inflight" in out["detail"] and h.worker.executor_mode is ExecutorMode.ASYNC


def _wait_ready(h: Harness, timeout_s: float = 10.0) -> None:
    wait_until(h.worker.is_ready, what="the worker to be ready", timeout=timeout_s, interval=0.02)


def test_a_kv_commit_the_runtime_refuses_fails_that_request_not_the_engine_loop() -> None:
    """A board reset by another alias's recovery drops this alias's KV sequences while its job runs: the commit
    of the finished job is refused. That request fails (its lanes' KV unknown, 000 §7.4); the loop serves on."""
    from calctl.runtime.errors import InvalidArgument

    with executor_engine(ExecutorMode.ASYNC, max_inflight=1, time_scale=0.2) as h:
        kv = h.rt.kv
        real_commit = kv.commit
        calls = itertools.count(1)

        def commit(seq):
            if next(calls) == 3:
                raise InvalidArgument(f"unknown KV sequence {seq} (dropped by a reset of the configuration)")
            return real_commit(seq)

        kv.commit = commit  # type: ignore[method-assign]
        first = h.run(1, tag="hit")
        after = h.run(2, tag="after")
        state = h.worker.state.value
    assert not first[0].ok and first[0].error and first[0].delivered_right(), first
    assert all(o.ok and o.tokens == GOLDEN for o in after), after
    assert state == "Ready", state


def test_sync_mode_does_not_schedule_in_a_slice_where_nothing_happened() -> None:
    """sync waits for its job in short slices to keep serving its inbox; a slice that ends with the job still
    running, nothing posted and no deadline due runs no schedule (its CPU would come out of the job's cores)."""
    with executor_engine(ExecutorMode.SYNC, max_inflight=1, time_scale=4.0) as h:
        core, counts = h.worker, {"slices": 0, "schedules": 0}
        wait_inline, schedule = core._exec.wait_inline, core._sched.schedule

        def counted_wait(*args, **kwargs):
            counts["slices"] += 1
            return wait_inline(*args, **kwargs)

        def counted_schedule(*args, **kwargs):
            counts["schedules"] += 1
            return schedule(*args, **kwargs)

        core._exec.wait_inline = counted_wait  # type: ignore[method-assign]
        core._sched.schedule = counted_schedule  # type: ignore[method-assign]
        since = time.monotonic_ns()
        assert all(o.ok and o.tokens == GOLDEN for o in h.run(2))
        jobs = len(_jobs(h, since))
        # Every slice that scheduled would be more than this bound; jobs too short for that prove nothing.
        assert counts["slices"] > 2 * jobs + 20, f"jobs shorter than the slices prove nothing: {counts}, {jobs} jobs"
        assert counts["schedules"] <= 2 * jobs + 10, f"{counts}, {jobs} jobs"
