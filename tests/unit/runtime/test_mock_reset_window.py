"""A reset of the mock board is atomic for submit (issue 26: faults after the reset cleared them).

``reset`` aborts the chips' jobs, then waits for the running ones with the board lock released. A hung chip is
HUNG, not FAULTED, so a submit in that window used to be accepted; the job queued behind the aborted one, survived
the reset and ran on the chips it had just cleared (after a board reset, on the dropped configuration), carrying
any halting fault it drew into the next generation. The window is opened here by a hook on the wait itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from calctl.runtime.errors import DeviceBusy
from calctl.runtime.mock import FaultKind, FaultRule, open_mock
from calctl.runtime.types import Health, JobState
from tests.unit.runtime.runtime_helpers import package, prefill_job
from tests.waiting import wait_until


class _HookedDone(threading.Event):
    """A job's ``done`` event that runs ``hook`` the first time the reset waits on it (lock released)."""

    def __init__(self, hook: Callable[[], None]) -> None:
        super().__init__()
        self._hook: Callable[[], None] | None = hook

    def wait(self, timeout: float | None = None) -> bool:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()
        return super().wait(timeout)


@pytest.mark.parametrize("scope", ["board", "chip"])
def test_a_submit_while_a_reset_waits_for_its_jobs_is_refused_not_carried_over(scope: str) -> None:
    pkg = package("combined")
    with open_mock(time_scale=0.0) as rt:
        rt.configure(rt.create_calbin(pkg))
        graph = pkg.model("model-a").prefill.name
        rt.arm_fault(FaultRule(kind=FaultKind.WAIT_TIMEOUT, at=(1,), graph=graph))
        hung = prefill_job(rt, pkg, "model-a")[0]
        wait_until(lambda: rt.query(hung).state is JobState.RUNNING, what="the hung job to run on chip 0")
        assert rt.health()[0].health is Health.HUNG
        in_window: list[object] = []

        def submit_in_the_window() -> None:
            try:
                in_window.append(prefill_job(rt, pkg, "model-a")[0])
            except DeviceBusy as exc:
                in_window.append(exc)

        rt._jobs[hung.id].done = _HookedDone(submit_in_the_window)
        rt.reset(scope, 0 if scope == "chip" else None)
        assert len(in_window) == 1
        assert isinstance(in_window[0], DeviceBusy), f"a job was accepted during the reset: {in_window[0]}"
        assert "being reset" in str(in_window[0])
        assert rt.query(hung).state is JobState.ABORTED
        assert all(c.pending == 0 for c in rt.counters()), "a job survived the reset"
        assert all(h.health is Health.OK for h in rt.health())
        if scope == "board":
            rt.configure(rt.create_calbin(pkg))  # the next generation starts on a clean board
        job = prefill_job(rt, pkg, "model-a")[0]  # after the reset, submits are accepted again
        assert rt.wait(job, 10).ok
