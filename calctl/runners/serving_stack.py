"""The in-process serving stack every runner that serves goes through.

``calctl serve`` without HTTP: a :class:`~calctl.serving.engine.DeviceSupervisor` over a runtime the caller
opened, the :class:`~calctl.serving.engine.ServingEngine` that routes requests to its engine cores, and an
:class:`~calctl.runners.traffic.EngineLoop` (an asyncio loop in its own thread) that drives the requests. The
bench scenarios, the soak and accept's rollback build exactly this and nothing else, so there is one place that
knows:

* the order of the end: the supervisor drains and unloads **while the loop still runs**, so the streams its
  shutdown aborts are delivered (never posted into a closed loop), and only then the loop closes and cancels
  what is left: on every way out, an interrupt included (001 §11.1 Draining → Unloading → Unloaded);
* what "settled" means after traffic: nothing in flight, no live request, and every alias Ready or Failed (a
  recovery after a fault ends in one of the two, 001 §11.3) with no recovery still queued;
* the engine's figures a runner reads (:class:`BatchCounters`), by their meaning rather than by their
  Prometheus names.

What it does not do: open or close the device (the caller's ``with device.open() as rt``), choose scheduler
configurations (``calctl.serving.config``), or judge anything.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from calctl.closing import Closes
from calctl.runners.traffic import EngineLoop
from calctl.runtime.interface import Runtime
from calctl.serving.config import SchedulerConfig
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions
from calctl.serving.engine.loop import EngineCore
from calctl.serving.engine.metrics import EngineMetrics
from calctl.signing.policy import TrustPolicy

# How long the end of a run waits for in-flight work when the caller names no deadline.
SHUTDOWN_DEADLINE_S = 5.0


@dataclass(frozen=True)
class BatchCounters:
    """One alias's batch figures since the engine started (000 §16): subtract two readings for a window."""

    fill_ratio_sum: float  # sum over decode jobs of active lanes / compiled batch
    decode_jobs: int  # decode jobs the fill ratio was observed on
    lane_waste: int  # inactive (padded) decode lanes launched
    submit_busy_retries: int  # submits the device answered DeviceBusy and the core retried

    def __sub__(self, other: BatchCounters) -> BatchCounters:
        return BatchCounters(
            self.fill_ratio_sum - other.fill_ratio_sum,
            self.decode_jobs - other.decode_jobs,
            self.lane_waste - other.lane_waste,
            self.submit_busy_retries - other.submit_busy_retries,
        )


# The engine's metric families behind each BatchCounters field (calctl.serving.engine.metrics).
_COUNTER_SAMPLES = {
    "fill_ratio_sum": "calctl_batch_fill_ratio_sum",
    "decode_jobs": "calctl_batch_fill_ratio_count",
    "lane_waste": "calctl_decode_lane_waste_total",
    "submit_busy_retries": "calctl_submit_busy_retries_total",
}


class ServingStack(Closes):
    """A supervisor, its engine and a traffic loop over ``rt``; ``with ServingStack(...) as stack:``.

    ``engine_type`` exists for tests that serve through a deliberately broken engine (a cross-wired router)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        trust: TrustPolicy,
        name: str,
        scheduler_configs: Mapping[str, SchedulerConfig] | None = None,
        options: SupervisorOptions | None = None,
        metrics: EngineMetrics | None = None,
        shutdown_deadline_s: float = SHUTDOWN_DEADLINE_S,
        engine_type: type[ServingEngine] = ServingEngine,
    ) -> None:
        self.rt = rt
        self.name = name
        self.shutdown_deadline_s = shutdown_deadline_s
        self.sup = DeviceSupervisor(
            rt,
            trust=trust,
            scheduler_configs=dict(scheduler_configs or {}),
            options=options or SupervisorOptions(),
            metrics=metrics,
        )
        self.engine = engine_type(self.sup)
        self._loop: EngineLoop | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, package: Path) -> None:
        """Load ``package`` through the supervisor's gate (validate, budget, golden and warm-up, 001 §11.1)."""
        self.sup.start(package)

    @property
    def loop(self) -> EngineLoop:
        """The traffic loop, started the first time it is asked for (a run that fails its load never needs one)."""
        if self._loop is None:
            self._loop = EngineLoop(self.name)
        return self._loop

    def close(self, deadline_s: float | None = None) -> None:
        """Drain and unload while the loop still runs, then close the loop. Idempotent; safe mid-interrupt."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sup.shutdown(self.shutdown_deadline_s if deadline_s is None else deadline_s)
        finally:
            if self._loop is not None:
                self._loop.close()

    # -- what runners read ---------------------------------------------------------------------------

    def core(self, alias: str) -> EngineCore:
        """The engine core serving ``alias`` (a KeyError names an alias that is not loaded)."""
        return self.sup.cores[alias]

    @property
    def aliases(self) -> list[str]:
        return list(self.sup.cores)

    def generations(self) -> dict[str, int]:
        return {a: w.generation for a, w in self.sup.cores.items()}

    def settled(self) -> bool:
        """Nothing in flight, no live request, every alias Ready or Failed, and no recovery waiting to run."""
        if self.sup.recovery_pending():
            return False
        return all(
            w.inflight() == 0 and w.live_requests() == 0 and (w.is_ready() or w.failed is not None)
            for w in self.sup.cores.values()
        )

    def wait_settled(self, timeout_s: float = 30.0) -> bool:
        """Poll :meth:`settled` until it holds or ``timeout_s`` passes; True if it held."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.settled():
                return True
            time.sleep(0.01)
        return self.settled()

    def batch_counters(self, alias: str) -> BatchCounters:
        """The engine's batch figures for ``alias`` now (read from its metrics registry)."""
        totals = dict.fromkeys(_COUNTER_SAMPLES, 0.0)
        by_sample = {sample: key for key, sample in _COUNTER_SAMPLES.items()}
        for metric in self.sup.metrics.registry.collect():
            for smp in metric.samples:
                key = by_sample.get(smp.name)
                if key is not None and smp.labels.get("model") == alias:
                    totals[key] += float(smp.value)
        return BatchCounters(
            totals["fill_ratio_sum"],
            int(totals["decode_jobs"]),
            int(totals["lane_waste"]),
            int(totals["submit_busy_retries"]),
        )


__all__ = ["SHUTDOWN_DEADLINE_S", "BatchCounters", "ServingStack"]
