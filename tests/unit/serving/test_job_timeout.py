"""A job timeout is a verdict about the device only when the device confirms it (issue 26, 001 §11.3).

Seen under host load in ``calctl bench --scenario fault-isolation``: one of B's decode jobs was declared timed out
after 1 s on the host's clock and completed 100 ms later (its late completion dropped as stale). The false timeout
reset B's chip and spent one of the board's two resets per 10 minutes, so the CCU fault on A two phases later found
the budget exhausted: A went Failed with chip 0 still faulted and the reload that followed died with
``cannot configure: chip 0 is faulted`` (G4 NOT MEASURED). The executor's clock is moved by hand here, so the
interleaving "the host's deadline passes while the device is still running the job" is forced, not waited for.
"""

from __future__ import annotations

from calctl.runtime import open_runtime
from calctl.runtime.mock import open_mock
from calctl.runtime.mock.faults import FaultKind, FaultRule
from calctl.runtime.types import Health
from calctl.serving.config import ExecutorMode
from calctl.serving.core.scheduler import JobStatus
from calctl.serving.engine.device import UNCONFIRMED_TIMEOUT_FACTOR
from tests.unit.runtime.runtime_helpers import golden_prompt, package
from tests.unit.serving.executor_helpers import executor, launch_prefill
from tests.unit.serving.serving_helpers import FakeClock
from tests.waiting import wait_until

TIMEOUT_S = 1.0


def test_a_job_the_device_still_runs_is_not_timed_out_on_the_hosts_clock() -> None:
    pkg = package("single")
    m = pkg.model("model-a")
    prompt = tuple(int(t) for t in golden_prompt(pkg, "model-a"))
    clock = FakeClock()
    # A job that takes far longer than the clock is moved below: the device is busy with it, not hung.
    with open_runtime("mock", time_scale=10_000.0) as rt:
        rt.configure(rt.create_calbin(pkg))
        ex = executor(rt, m, clock, mode=ExecutorMode.SYNC, job_timeout_s=TIMEOUT_S)
        inf = launch_prefill(ex, m, prompt, 1)
        wait_until(lambda: rt.query(inf.rt_job).state.value == "running", what="the job to start")
        clock.advance(TIMEOUT_S * 1.5)  # past the host's deadline: a starved host woke the waiter this late
        assert {h.chip: h.health for h in rt.health()}[0] is Health.OK
        assert not ex.timed_out(inf), "a chip reporting OK runs the job: no verdict about the device yet"
        clock.advance(TIMEOUT_S * UNCONFIRMED_TIMEOUT_FACTOR)  # a runtime that never reports a hang: bounded
        assert ex.timed_out(inf)
        outcome = ex.time_out(inf)
        assert outcome is not None and outcome.status is JobStatus.TIMEOUT
        assert f"{UNCONFIRMED_TIMEOUT_FACTOR} x the" in outcome.detail
        rt.reset("board")


def test_a_hung_chip_confirms_the_timeout_at_once() -> None:
    pkg = package("single")
    m = pkg.model("model-a")
    prompt = tuple(int(t) for t in golden_prompt(pkg, "model-a"))
    clock = FakeClock()
    with open_mock(time_scale=0.0) as rt:
        rt.configure(rt.create_calbin(pkg))
        rt.arm_fault(FaultRule(FaultKind.WAIT_TIMEOUT, at=(1,), graph=m.prefill.name))
        ex = executor(rt, m, clock, mode=ExecutorMode.SYNC, job_timeout_s=TIMEOUT_S)
        inf = launch_prefill(ex, m, prompt, 1)
        wait_until(lambda: rt.health()[0].health is Health.HUNG, what="the injected hang to halt chip 0")
        assert not ex.timed_out(inf)  # before the deadline nothing is judged
        clock.advance(TIMEOUT_S * 1.01)
        assert ex.timed_out(inf)
        outcome = ex.time_out(inf)
        assert outcome is not None and outcome.status is JobStatus.TIMEOUT
        assert "chip 0 reports hung" in outcome.detail
        rt.reset("chip", 0)


def test_a_job_that_finished_as_the_deadline_passed_is_not_timed_out() -> None:
    pkg = package("single")
    m = pkg.model("model-a")
    prompt = tuple(int(t) for t in golden_prompt(pkg, "model-a"))
    clock = FakeClock()
    with open_runtime("mock", time_scale=0.0) as rt:
        rt.configure(rt.create_calbin(pkg))
        ex = executor(rt, m, clock, mode=ExecutorMode.SYNC, job_timeout_s=TIMEOUT_S)
        inf = launch_prefill(ex, m, prompt, 1)
        wait_until(lambda: rt.query(inf.rt_job).state.terminal, what="the job to finish")
        clock.advance(TIMEOUT_S * 2)  # the waiter looks only now: the next wait sees the job done
        assert not ex.timed_out(inf)
        assert ex.wait_inline(inf, 0.0)
        fin = ex.finish(inf)
        assert fin is not None and fin.outcome.status is JobStatus.OK
