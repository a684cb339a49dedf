"""The ping/pong downgrade monitor: when to stop running two jobs in flight (000 §14).

000 §14 lists the conditions; each is one method here, fed by the alias's engine core
(through its device executor):

* output crosstalk: non-finite logits, a lane result for a request that is not
  in the job, a job completing on a bank that holds another job, shared slot
  state (:meth:`ExecutorMonitor.crosstalk`);
* status or counter anomalies: the runtime's answer about a job contradicts
  itself (:meth:`status_anomaly`); a chip's finished/failed counters go
  backwards, or its pending counter stays open while this engine core has nothing on
  the device (:meth:`counters`);
* P99 regression: the inter-token P99 under ping/pong exceeds the baseline by
  more than ``p99_regression`` (:meth:`latency`). The baseline is
  ``p99_baseline_s`` when configured (a bench's sync/async P99), else the P99
  this engine core measured while it last ran with one job in flight; without either
  the check waits for a baseline and says so in :meth:`state`. Latency depends
  on load, so a baseline from a different load can mislead; docs/executor.md;
* N consecutive DeviceBusy at submit or N consecutive Wait timeouts;
* uncertain recovery: a fault that needs a reset while two jobs shared the chip
  (which job caused it, and what it did to the other, cannot be known).

The monitor only *decides*: every method returns a :class:`Downgrade` when a
condition fires while ping/pong is in use, else None. Outside ping/pong it
keeps its bookkeeping (the latency baseline, the counter history) and never
fires. It owns no thread, no device and no clock (``now`` is an argument), and
it never re-enables ping/pong: that is an operator action (000 §14).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from calctl.runtime.types import ChipCounters
from calctl.serving.config import DowngradePolicy, ExecutorMode
from calctl.serving.engine.modes import DowngradeReason


@dataclass(frozen=True)
class Downgrade:
    reason: DowngradeReason
    detail: str


class ExecutorMonitor:
    """Not thread-safe, and needs no lock: only the engine core's thread calls it (its device executor and
    mode control run there too)."""

    def __init__(self, policy: DowngradePolicy, mode: ExecutorMode, *, chip_exclusive: bool = True) -> None:
        self.policy = policy
        self.chip_exclusive = chip_exclusive  # pending counters are ours alone only if no other alias uses the chip
        self._armed = mode is ExecutorMode.PINGPONG
        self._busy_run = 0
        self._timeout_run = 0
        self._baseline: deque[float] = deque(maxlen=policy.p99_window)
        self._window: deque[float] = deque(maxlen=policy.p99_window)
        self._since_check = 0
        self._last_p99: float | None = None
        self._counters: dict[int, ChipCounters] = {}
        self._pending_open_since: dict[int, float] = {}

    # -- mode -------------------------------------------------------------------------------------

    @property
    def armed(self) -> bool:
        """True while ping/pong is in use: only then do conditions fire."""
        return self._armed

    def set_mode(self, mode: ExecutorMode) -> None:
        armed = mode is ExecutorMode.PINGPONG
        if armed and not self._armed:  # a fresh ping/pong period: fresh runs and a fresh window
            self._busy_run = self._timeout_run = 0
            self._window.clear()
            self._since_check = 0
            self._last_p99 = None
        self._armed = armed

    def _fire(self, reason: DowngradeReason, detail: str) -> Downgrade | None:
        return Downgrade(reason, detail) if self._armed else None

    # -- conditions -------------------------------------------------------------------------------

    def crosstalk(self, detail: str) -> Downgrade | None:
        return self._fire(DowngradeReason.OUTPUT_CROSSTALK, detail)

    def status_anomaly(self, detail: str) -> Downgrade | None:
        return self._fire(DowngradeReason.STATUS_ANOMALY, detail)

    def recovery_needed(self, detail: str) -> Downgrade | None:
        return self._fire(
            DowngradeReason.UNCERTAIN_RECOVERY, f"recovery needed with two jobs sharing the chip: {detail}"
        )

    def submit_busy(self) -> Downgrade | None:
        self._busy_run += 1
        if self._busy_run >= self.policy.consecutive_busy:
            return self._fire(DowngradeReason.CONSECUTIVE_BUSY, f"DeviceBusy {self._busy_run} times in a row at submit")
        return None

    def submit_ok(self) -> None:
        self._busy_run = 0

    def job_timed_out(self) -> Downgrade | None:
        self._timeout_run += 1
        if self._timeout_run >= self.policy.consecutive_timeouts:
            return self._fire(
                DowngradeReason.CONSECUTIVE_TIMEOUTS, f"Wait timed out {self._timeout_run} time(s) in a row"
            )
        return None

    def job_completed(self) -> None:
        self._timeout_run = 0

    def counters(self, sample: ChipCounters, *, own_jobs: int, now: float) -> Downgrade | None:
        """One reading of the chip's counters; ``own_jobs``: this engine core's jobs in flight or quarantined."""
        chip = sample.chip
        prev = self._counters.get(chip)
        self._counters[chip] = sample
        if prev is not None:
            for name in ("finished", "failed"):
                before, after = getattr(prev, name), getattr(sample, name)
                if before is not None and after is not None and after < before:
                    return self._fire(
                        DowngradeReason.COUNTER_ANOMALY,
                        f"chip {chip} {name} counter went backwards: {before} -> {after}",
                    )
        if sample.pending is None:
            return None  # the runtime cannot tell: no check (001 §14), never a guessed 0
        if sample.pending < 0:
            return self._fire(
                DowngradeReason.COUNTER_ANOMALY, f"chip {chip} pending counter is negative ({sample.pending})"
            )
        if not self.chip_exclusive or own_jobs > 0 or sample.pending == 0:
            self._pending_open_since.pop(chip, None)
            return None
        since = self._pending_open_since.setdefault(chip, now)
        if now - since > self.policy.pending_grace_s:
            return self._fire(
                DowngradeReason.COUNTER_ANOMALY,
                f"chip {chip} pending counter stays at {sample.pending} for {now - since:.1f}s with no job of ours on it",
            )
        return None

    def reset_counters(self) -> None:
        """After a reset or reconfigure the runtime may restart its counters: forget the history."""
        self._counters.clear()
        self._pending_open_since.clear()

    def latency(self, seconds: float) -> Downgrade | None:
        """One inter-token latency. Outside ping/pong it feeds the baseline window."""
        if not self._armed:
            self._baseline.append(seconds)
            return None
        self._window.append(seconds)
        self._since_check += 1
        if len(self._window) < self.policy.p99_min_samples or self._since_check < self.policy.p99_min_samples:
            return None
        self._since_check = 0
        baseline = self.baseline_p99()
        self._last_p99 = float(np.percentile(np.asarray(self._window), 99))
        if baseline is None:
            return None
        limit = baseline * (1 + self.policy.p99_regression)
        if self._last_p99 > limit:
            return self._fire(
                DowngradeReason.P99_REGRESSION,
                f"inter-token P99 {self._last_p99 * 1e3:.2f} ms over the last {len(self._window)} tokens exceeds the "
                f"baseline {baseline * 1e3:.2f} ms by more than {self.policy.p99_regression:.0%}",
            )
        return None

    def baseline_p99(self) -> float | None:
        if self.policy.p99_baseline_s is not None:
            return self.policy.p99_baseline_s
        if len(self._baseline) < self.policy.p99_min_samples:
            return None
        return float(np.percentile(np.asarray(self._baseline), 99))

    # -- reading ----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        baseline = self.baseline_p99()
        return {
            "armed": self._armed,
            "consecutive_busy": self._busy_run,
            "consecutive_timeouts": self._timeout_run,
            "p99_baseline_ms": None if baseline is None else baseline * 1e3,
            "p99_baseline_source": "configured"
            if self.policy.p99_baseline_s is not None
            else (
                "measured with one job in flight"
                if baseline is not None
                else "none yet: the P99 check is waiting for a baseline"
            ),
            "p99_window_ms": None if self._last_p99 is None else self._last_p99 * 1e3,
            "thresholds": {
                "p99_regression": self.policy.p99_regression,
                "consecutive_busy": self.policy.consecutive_busy,
                "consecutive_timeouts": self.policy.consecutive_timeouts,
                "pending_grace_s": self.policy.pending_grace_s,
                "p99_window": self.policy.p99_window,
                "p99_min_samples": self.policy.p99_min_samples,
            },
        }


__all__ = ["Downgrade", "ExecutorMonitor"]
