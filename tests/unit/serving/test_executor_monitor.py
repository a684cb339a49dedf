"""The ping/pong downgrade monitor (000 §14): each condition fires only while ping/pong is in use, at its threshold."""

from __future__ import annotations

from typing import Any

import pytest

from calctl.runtime.types import ChipCounters
from calctl.serving.config import DowngradePolicy, ExecutorMode
from calctl.serving.engine.modes import DowngradeReason
from calctl.serving.engine.monitor import ExecutorMonitor

PP = ExecutorMode.PINGPONG


def monitor(mode: ExecutorMode = PP, **policy: Any) -> ExecutorMonitor:
    return ExecutorMonitor(DowngradePolicy(**policy), mode)


def test_nothing_fires_outside_pingpong() -> None:
    for mode in (ExecutorMode.SYNC, ExecutorMode.ASYNC):
        m = monitor(mode, consecutive_busy=1, consecutive_timeouts=1)
        assert not m.armed
        assert m.crosstalk("x") is None and m.status_anomaly("x") is None and m.recovery_needed("x") is None
        assert m.submit_busy() is None and m.job_timed_out() is None


@pytest.mark.parametrize(
    "call, reason",
    [
        (lambda m: m.crosstalk("non-finite logits"), DowngradeReason.OUTPUT_CROSSTALK),
        (lambda m: m.status_anomaly("reported done but running"), DowngradeReason.STATUS_ANOMALY),
        (lambda m: m.recovery_needed("fault: CCU_EXCEPTION"), DowngradeReason.UNCERTAIN_RECOVERY),
    ],
)
def test_immediate_conditions(call, reason) -> None:
    d = call(monitor())
    assert d is not None and d.reason is reason and d.detail


def test_consecutive_busy_counts_a_run_and_a_success_resets_it() -> None:
    m = monitor(consecutive_busy=3)
    assert m.submit_busy() is None and m.submit_busy() is None
    m.submit_ok()
    assert m.submit_busy() is None and m.submit_busy() is None
    d = m.submit_busy()
    assert d is not None and d.reason is DowngradeReason.CONSECUTIVE_BUSY and "3 times" in d.detail


def test_consecutive_timeouts() -> None:
    m = monitor(consecutive_timeouts=2)
    assert m.job_timed_out() is None
    m.job_completed()
    assert m.job_timed_out() is None
    d = m.job_timed_out()
    assert d is not None and d.reason is DowngradeReason.CONSECUTIVE_TIMEOUTS


def test_entering_pingpong_starts_fresh_runs() -> None:
    m = monitor(ExecutorMode.ASYNC, consecutive_busy=2)
    m.submit_busy()
    m.submit_busy()  # counted while async, but never fires there
    m.set_mode(PP)
    assert m.submit_busy() is None  # a fresh run: one busy is not two
    assert m.submit_busy() is not None


def test_counters_going_backwards() -> None:
    m = monitor()
    assert m.counters(ChipCounters(0, 1, 10, 2), own_jobs=1, now=0.0) is None
    assert m.counters(ChipCounters(0, 0, 11, 2), own_jobs=0, now=0.1) is None
    d = m.counters(ChipCounters(0, 0, 9, 2), own_jobs=0, now=0.2)
    assert (
        d is not None
        and d.reason is DowngradeReason.COUNTER_ANOMALY
        and "finished" in d.detail
        and "11 -> 9" in d.detail
    )
    m.reset_counters()  # after a reset the runtime may restart them: no anomaly
    assert m.counters(ChipCounters(0, 0, 0, 0), own_jobs=0, now=0.3) is None


def test_pending_that_does_not_close_while_we_have_nothing_on_the_chip() -> None:
    m = monitor(pending_grace_s=1.0)
    assert m.counters(ChipCounters(0, 1, 5, 0), own_jobs=0, now=10.0) is None  # may be a race: start the clock
    assert m.counters(ChipCounters(0, 1, 5, 0), own_jobs=0, now=10.9) is None
    d = m.counters(ChipCounters(0, 1, 5, 0), own_jobs=0, now=11.2)
    assert d is not None and d.reason is DowngradeReason.COUNTER_ANOMALY and "pending" in d.detail


def test_pending_closing_or_our_own_jobs_reset_the_grace() -> None:
    m = monitor(pending_grace_s=1.0)
    m.counters(ChipCounters(0, 1, 5, 0), own_jobs=0, now=0.0)
    assert m.counters(ChipCounters(0, 1, 5, 0), own_jobs=1, now=0.5) is None  # our job: pending is explained
    assert m.counters(ChipCounters(0, 1, 6, 0), own_jobs=0, now=0.6) is None
    assert m.counters(ChipCounters(0, 1, 6, 0), own_jobs=0, now=1.5) is None  # grace restarted at 0.6
    shared = ExecutorMonitor(DowngradePolicy(pending_grace_s=0.0), PP, chip_exclusive=False)
    shared.counters(ChipCounters(0, 3, 0, 0), own_jobs=0, now=0.0)
    assert shared.counters(ChipCounters(0, 3, 0, 0), own_jobs=0, now=5.0) is None  # another alias's jobs


def test_unknown_counters_are_never_judged() -> None:
    m = monitor(pending_grace_s=0.0)
    for t in range(3):
        assert m.counters(ChipCounters(0, None, None, None), own_jobs=0, now=float(t)) is None


def test_p99_regression_against_the_measured_one_in_flight_baseline() -> None:
    m = monitor(ExecutorMode.ASYNC, p99_window=100, p99_min_samples=20, p99_regression=0.05)
    for _ in range(50):
        assert m.latency(0.010) is None  # baseline: 10 ms
    m.set_mode(PP)
    for _ in range(19):
        assert m.latency(0.0104) is None
    assert m.latency(0.0104) is None  # +4 %: within 5 %
    for _ in range(19):
        assert m.latency(0.020) is None
    d = m.latency(0.020)
    assert d is not None and d.reason is DowngradeReason.P99_REGRESSION and "exceeds the baseline 10.00 ms" in d.detail


def test_p99_check_waits_for_a_baseline_and_says_so() -> None:
    m = monitor(p99_window=50, p99_min_samples=10)
    assert all(m.latency(1.0) is None for _ in range(40))
    assert m.state()["p99_baseline_ms"] is None and "waiting" in m.state()["p99_baseline_source"]
    configured = monitor(p99_window=50, p99_min_samples=10, p99_baseline_s=0.5)
    results = [configured.latency(1.0) for _ in range(10)]
    assert results[-1] is not None and results[-1].reason is DowngradeReason.P99_REGRESSION
    assert configured.state()["p99_baseline_source"] == "configured"
