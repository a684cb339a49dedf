"""Who the mock board wakes: a submit wakes only the threads of the chip it targets, and waiting for one job
waits on that job alone, not on every change of the board (issue 32 item 5: a mock submit that woke all four
chip threads, and every waiter, on every submit and job end)."""

from __future__ import annotations

import threading
from collections import Counter

from calctl.runtime import open_runtime
from calctl.runtime.mock import MockRuntime
from tests.unit.runtime.runtime_helpers import package, prefill_job


def _count_wakes(rt: MockRuntime) -> Counter[str]:
    """Count, from now on, the threads each chip's condition and the board's were asked to wake (``notify(n)``
    adds ``n``; ``notify_all`` goes through ``notify`` with the number of waiters)."""
    wakes: Counter[str] = Counter()

    def counting(cv: threading.Condition, name: str) -> None:
        real = cv.notify

        def notify(n: int = 1) -> None:
            wakes[name] += n
            real(n)

        cv.notify = notify  # type: ignore[method-assign]

    for chip in rt._chips:
        counting(chip.cv, f"chip{chip.index}")
    counting(rt._cv, "board")
    return wakes


def test_a_submit_wakes_only_the_chip_it_targets() -> None:
    pkg = package("combined")
    with open_runtime("mock", time_scale=0.0) as rt:
        assert isinstance(rt, MockRuntime)
        rt.configure(rt.create_calbin(pkg))
        for alias in ("model-a", "model-b"):  # warm up both chips
            rt.wait(prefill_job(rt, pkg, alias)[0], 10)
        wakes = _count_wakes(rt)
        job = prefill_job(rt, pkg, "model-a")[0]
        assert job.chips == (0,)
        # The submit woke one of chip 0's two (idle, alike) threads, none of chip 1's.
        assert wakes["chip0"] == 1 and wakes["chip1"] == 0, wakes
        rt.wait(job, 10)
        assert wakes["chip1"] == 0, wakes  # nor did the job's end on chip 0 wake chip 1's threads


def test_waiting_for_one_job_returns_when_it_ends_whatever_else_the_board_does() -> None:
    pkg = package("combined")
    with open_runtime("mock", time_scale=1.0) as rt:
        assert isinstance(rt, MockRuntime)
        rt.configure(rt.create_calbin(pkg))
        rt.wait(prefill_job(rt, pkg, "model-a")[0], 10)
        slow = prefill_job(rt, pkg, "model-a")[0]
        other = prefill_job(rt, pkg, "model-b")[0]  # ends meanwhile on chip 1: not what the waiter waits for
        assert rt.wait_any([slow], 10) == [slow]
        assert rt.query(slow).state.terminal
        assert rt.wait_any([other], 10) == [other]
        assert rt.wait_any([slow, other], 10) == [slow, other]  # several jobs: both already done
