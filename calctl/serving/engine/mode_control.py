"""ModeControl: one alias's executor mode and its 000 §14 downgrades, on the engine core's thread.

The core asks it which mode a job runs in; the :class:`~calctl.serving.engine.monitor.ExecutorMonitor`'s
verdicts (counter anomalies, P99 regression, output crosstalk, a recovery) leave ping/pong for the
configured one-in-flight mode; only an operator goes back (:meth:`ModeControl.set_by_operator`).
Only new jobs see a new mode: jobs already submitted drain (docs/executor.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from calctl.runtime.errors import RuntimeLayerError
from calctl.serving.config import ExecutorMode
from calctl.serving.core.scheduler import Scheduler
from calctl.serving.engine.device import DeviceExecutor
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.modes import DowngradeReason, DowngradeRecord, OperatorModeChange
from calctl.serving.engine.monitor import Downgrade, ExecutorMonitor
from calctl.serving.engine.options import CoreOptions

log = logging.getLogger("calctl.serve")

#: How often the core reads its chip's counters for the downgrade monitor (000 §14).
COUNTER_CHECK_S = 0.25
MAX_DOWNGRADE_RECORDS = 100


class ModeControl:
    """The executor mode of one alias (000 §14). Engine thread only, except the read-only properties."""

    def __init__(
        self,
        alias: str,
        chips: tuple[int, ...],
        options: CoreOptions,
        sched: Scheduler,
        executor: DeviceExecutor,
        monitor: ExecutorMonitor,
        metrics: EngineMetrics,
    ) -> None:
        self.alias = alias
        self.chips = chips
        self.configured = configured = options.mode  # ``executor.mode`` (000 §15)
        self._downgrade_to = options.downgrade.to
        self._fixed_engine = options.fixed_engine
        self._sched = sched
        self._exec = executor
        self._monitor = monitor
        self._metrics = metrics
        self.mode = configured
        self.downgrades: list[DowngradeRecord] = []  # automatic only (000 §14)
        self._operator_changes: list[OperatorModeChange] = []
        self._next_counter_check = 0.0
        sched.set_inflight_limit(configured.max_inflight)

    def status(self) -> dict[str, Any]:
        ex = self._exec
        return {
            "alias": self.alias,
            "mode": self.mode.value,
            "configured_mode": self.configured.value,
            "max_inflight": self._sched.inflight_limit,
            "configured_max_inflight": self._sched.settings.budget.max_inflight_jobs,
            "inflight_jobs": len(ex.inflight),
            "banks": ex.slots.holders() if self.mode is ExecutorMode.PINGPONG or ex.slots.busy() else None,
            "downgrades": [d.as_dict() for d in self.downgrades],
            "operator_changes": [c.as_dict() for c in self._operator_changes],
            "monitor": self._monitor.state(),
        }

    def act_on_verdicts(self) -> None:
        for verdict in self._exec.take_verdicts():
            self.apply(verdict)

    def apply(self, verdict: Downgrade | None) -> None:
        """Act on a monitor verdict: leave ping/pong for the configured one-in-flight mode."""
        if verdict is None or self.mode is not ExecutorMode.PINGPONG:
            return
        self._change(self._downgrade_to, verdict.reason, verdict.detail)

    def _change(self, mode: ExecutorMode, reason: DowngradeReason | None, detail: str) -> None:
        """Only new jobs see the new mode: the scheduler hands out no job until fewer than the new limit are
        in flight, so the ping/pong jobs already submitted drain first (000 §14). ``reason`` None: an
        operator's choice, not a downgrade (not counted in the metric). Jobs already handed to a completion
        thread stay there when the mode becomes sync; only jobs submitted from now on are waited inline. Jobs
        submitted in sync go to a completion thread when the mode leaves sync: nothing else would wait for them."""
        previous = self.mode
        self.mode = mode
        if mode is not ExecutorMode.SYNC:
            for inf in list(self._exec.inflight.values()):
                self._exec.hand_to_completer(inf)
        self._sched.set_inflight_limit(mode.max_inflight)
        self._monitor.set_mode(mode)
        if reason is not None and previous is ExecutorMode.PINGPONG and mode is not ExecutorMode.PINGPONG:
            rec = DowngradeRecord(time.time(), previous, mode, reason, detail, len(self._exec.inflight))
            self.downgrades.append(rec)
            del self.downgrades[:-MAX_DOWNGRADE_RECORDS]
            self._metrics.downgrades.labels(self.alias, reason.value).inc()
            log.warning(
                "executor downgrade: model=%s from=%s to=%s reason=%s draining_jobs=%d detail=%s",
                self.alias,
                previous.value,
                mode.value,
                reason.value,
                rec.draining_jobs,
                detail,
            )

    def set_by_operator(self, mode: ExecutorMode) -> dict[str, Any]:
        """Operator action: use ``mode`` for jobs not yet submitted; jobs in flight drain.

        The only way back to ping/pong after a downgrade (000 §14: never automatic). Refused
        (``ok: False``) when the configuration does not allow it: ``executor.max_inflight`` is the
        ceiling, and ping/pong cannot use a fixed engine."""
        ceiling = self._sched.settings.budget.max_inflight_jobs
        if mode.max_inflight > ceiling:
            return {
                **self.status(),
                "ok": False,
                "detail": f"{mode.value} needs executor.max_inflight {mode.max_inflight}; "
                f"the configuration allows {ceiling}",
            }
        if mode is ExecutorMode.PINGPONG and self._fixed_engine:
            return {**self.status(), "ok": False, "detail": "executor.fixed_engine is set: ping/pong needs both banks"}
        previous = self.mode
        self._change(mode, None, "set by an operator")
        self._operator_changes.append(OperatorModeChange(time.time(), previous, mode))
        del self._operator_changes[:-MAX_DOWNGRADE_RECORDS]
        log.info(
            "executor mode of %s set by an operator: %s -> %s (jobs in flight drain)",
            self.alias,
            previous.value,
            mode.value,
        )
        return {**self.status(), "ok": True, "previous_mode": previous.value}

    def check_counters(self, now: float, serving: bool) -> None:
        """Feed the chip's job counters to the downgrade monitor (000 §14 counter anomalies)."""
        rt = self._exec.rt
        if rt is None or not serving or now < self._next_counter_check:
            return
        self._next_counter_check = now + COUNTER_CHECK_S
        try:
            counters = rt.counters()
        except RuntimeLayerError as exc:
            log.warning("engine %s: reading chip counters failed: %s", self.alias, exc)
            return
        own = len(self._exec.inflight) + len(self._exec.quarantine)
        for c in counters:
            if c.chip in self.chips:
                self.apply(self._monitor.counters(c, own_jobs=own, now=now))


__all__ = ["COUNTER_CHECK_S", "MAX_DOWNGRADE_RECORDS", "ModeControl"]
