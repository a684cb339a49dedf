"""The waits for a job turn into short slices just before its expected end (end_window.py, issue 55).

No timing is asserted: the clock is moved by hand, and what is checked is how long each wait is asked to be.
"""

from __future__ import annotations

import pytest

from calctl.runtime import open_runtime
from calctl.serving.engine.end_window import LEAD_S, MAX_SPREAD, RECENT, SLICE_S, EndWindows, Window
from tests.unit.runtime.runtime_helpers import golden_prompt, package
from tests.unit.serving.executor_helpers import executor, finish, launch_prefill
from tests.unit.serving.serving_helpers import FakeClock


def test_a_shape_without_history_gets_no_window() -> None:
    assert EndWindows().window(("g", 1, 1), submitted=10.0) is None


def test_a_steady_shape_opens_before_its_soonest_end_and_closes_after_its_latest() -> None:
    ends = EndWindows()
    for s in (0.0032, 0.00321, 0.00319):
        ends.observe("decode", s)
    w = ends.window("decode", submitted=1.0)
    assert w == Window(1.0 + 0.00319 - LEAD_S, 1.0 + 0.00321 + LEAD_S)
    assert w.wait_s(1.0, timeout=0.02) == pytest.approx(0.00319 - LEAD_S)  # until it opens
    assert w.wait_s(1.0, timeout=0.001) == 0.001  # a shorter wait asked for stays shorter
    assert w.wait_s(1.0 + 0.0032, timeout=0.02) == SLICE_S  # inside: one slice
    assert w.is_open(1.0 + 0.0032) and not w.is_open(1.0) and not w.is_open(1.0 + 0.004)
    assert w.wait_s(1.0 + 0.004, timeout=0.02) == 0.02  # past it: the wait is the caller's again


def test_a_shape_whose_times_spread_wide_gets_no_window() -> None:
    """A decoder computing on the host's cores (5-8 ms a step) is not predictable: slicing its wait would only take
    the interpreter lock from it."""
    ends = EndWindows()
    ends.observe("decode", 0.005)
    ends.observe("decode", 0.005 * (1 + MAX_SPREAD) + 1e-6)
    assert ends.window("decode", 0.0) is None
    for _ in range(RECENT):  # the wide one ages out of the recent jobs
        ends.observe("decode", 0.005)
    assert ends.window("decode", 0.0) is not None


def test_forget_drops_every_expectation() -> None:
    ends = EndWindows()
    ends.observe("prefill", 0.004)
    ends.forget()
    assert ends.window("prefill", 0.0) is None


def test_a_job_launched_alone_gets_the_window_of_its_shapes_device_time() -> None:
    pkg = package("single")
    m = pkg.model("model-a")
    prompt = tuple(int(t) for t in golden_prompt(pkg, "model-a"))
    clock = FakeClock()
    with open_runtime("mock") as rt:
        rt.configure(rt.create_calbin(pkg))
        ex = executor(rt, m, clock)
        first = launch_prefill(ex, m, prompt, 1)
        assert first.window is None  # nothing known of the shape yet
        finish(ex, first, clock, 0.5)
        device_s = rt.query(first.rt_job).device_seconds
        assert device_s is not None and device_s > 0

        clock.advance(1.0)
        second = launch_prefill(ex, m, prompt, 2)
        # The device's own time of the first, not the host's (longer) time for it.
        assert second.window == Window(clock.now + device_s - LEAD_S, clock.now + device_s + LEAD_S)
        third = launch_prefill(ex, m, prompt, 3)
        assert third.window is None, "behind another job its start is not known"

        assert ex.due_now() is None
        assert ex.soonest_wait_s(0.02) == pytest.approx(device_s - LEAD_S)
        assert ex.soonest_wait_s(None) == pytest.approx(device_s - LEAD_S)
        clock.advance(device_s)
        assert ex.due_now() is second
        assert ex.wait_s(second, 0.02) == SLICE_S
        assert ex.wait_s(third, 0.02) == 0.02
        for inf in (second, third):
            finish(ex, inf, clock, 0.5)
        ex.forget_device_state()
        clock.advance(1.0)
        assert launch_prefill(ex, m, prompt, 4).window is None  # after a reset nothing is expected
