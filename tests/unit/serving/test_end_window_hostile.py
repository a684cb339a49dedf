"""A runtime whose job times are absurd does not stretch the engine's waits (end_window.py, issue 55).

The window of a job is learned from the device time its runtime reports (``start_ns`` / ``end_ns``). A runtime
that reports a time longer than the host saw the job take (a clock in other units, another epoch, 1e18 ns)
would put the window far after the job's real end: the completion thread stands aside for it and the engine waits
for it to open, so every such job ended late. The host's own time is used instead.
"""

from __future__ import annotations

import dataclasses

import pytest

from calctl.runtime import open_runtime
from calctl.runtime.types import JobResult
from tests.unit.runtime.runtime_helpers import golden_prompt, package
from tests.unit.serving.executor_helpers import executor, finish, launch_prefill
from tests.unit.serving.serving_helpers import FakeClock

HOST_S = 0.004  # how long the host sees each job take (the fake clock moves this much while it runs)


@pytest.mark.parametrize(
    ("start_ns", "end_ns"),
    [
        (0, 10**18),  # 1e9 s
        (1_000, 1_000 + 2 * 10**9),  # 2 s: longer than the host saw
        (5_000, 1_000),  # ended before it started (also a status anomaly; not a device time)
    ],
)
def test_a_device_time_the_host_never_saw_is_not_learned(start_ns: int, end_ns: int) -> None:
    pkg = package("single")
    m = pkg.model("model-a")
    prompt = tuple(int(t) for t in golden_prompt(pkg, "model-a"))
    clock = FakeClock()
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(pkg))
        real_query = rt.query

        def lying_query(job: object) -> JobResult:
            res = real_query(job)  # type: ignore[arg-type]
            return dataclasses.replace(res, start_ns=start_ns, end_ns=end_ns) if res.ok else res

        rt.query = lying_query  # type: ignore[method-assign]
        ex = executor(rt, m, clock)
        for n in range(1, 4):
            finish(ex, launch_prefill(ex, m, prompt, n), clock, HOST_S)
        nxt = launch_prefill(ex, m, prompt, 9)
        assert nxt.window is not None
        assert nxt.window.opens <= nxt.submitted + HOST_S, "the window opens after the job's real end"


def test_a_window_that_opened_since_the_core_looked_ends_the_inbox_wait_at_once() -> None:
    """The core asks for a due job, then for its inbox wait; a window that opens in between must not leave it
    blocked on the inbox (without a deadline: for good) while the job's completion thread stands aside."""
    pkg = package("single")
    m = pkg.model("model-a")
    prompt = tuple(int(t) for t in golden_prompt(pkg, "model-a"))
    clock = FakeClock()
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(pkg))
        ex = executor(rt, m, clock)
        finish(ex, launch_prefill(ex, m, prompt, 1), clock, HOST_S)
        second = launch_prefill(ex, m, prompt, 2)
        assert second.window is not None
        clock.now = second.window.opens + 1e-6  # it opened just now
        assert ex.soonest_wait_s(None) == 0.0
        assert ex.soonest_wait_s(0.02) == 0.0
        clock.now = second.window.closes  # closed: waits are the caller's again
        assert ex.soonest_wait_s(None) is None
        assert ex.soonest_wait_s(0.02) == 0.02


def test_a_shorter_prompt_is_not_given_the_window_of_longer_ones() -> None:
    """A prefill's time follows its prompt's length: after eight 127-token prompts (10.4 ms on the mock) a 64-token
    one (7.2 ms) got their window, opening 3 ms after it ended; its end was noticed only then."""
    pkg = package("single")
    m = pkg.model("model-a")
    clock = FakeClock()
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(pkg))
        ex = executor(rt, m, clock)
        for n in range(1, 9):
            finish(ex, launch_prefill(ex, m, (5,) * 127, n), clock, 1.0)
        short = launch_prefill(ex, m, (5,) * 64, 9)
        while not ex.wait_inline(short, 1.0):
            pass
        device_s = rt.query(short.rt_job).device_seconds
        assert device_s is not None
        assert short.window is None or short.window.opens <= short.submitted + device_s, (short.window, device_s)
