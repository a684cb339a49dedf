"""``calctl soak``, the clients: the mixed traffic sent on the engine loop, and what it is counted into.

* :class:`SubmitCounter` – every submit the runtime accepted, per chip (the host side of the job counters);
* :class:`RequestBook` – every finished request by outcome, alias and kind, per cycle and for the picture;
* :class:`TrafficDriver` – ``clients_per_model`` clients per alias sending :mod:`calctl.runners.soak.mix`.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calctl.checks.stats import percentiles
from calctl.runners.soak import evidence
from calctl.runners.soak.mix import MixedTraffic, ModelLimits, PoolPrompt, reference_pool
from calctl.runners.soak.plan import SoakConfig
from calctl.runners.traffic import EngineLoop, EngineResult, RequestOutcome, drive_engine_request, error_reason
from calctl.runtime.types import Job
from calctl.serving.engine import DeviceSupervisor, ServingEngine
from calctl.serving.protocol import GenerationRequest
from calctl.serving.record_sink import ms

# ---------------------------------------------------------------------------
# Submits counted on the host


class SubmitCounter:
    """Every submit the runtime accepted, per chip (``Runtime.on_submit``): the host side of "job counters
    close", checked against the chips' own counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per_chip: Counter[int] = Counter()

    def count(self, job: Job) -> None:
        with self._lock:
            for c in job.chips:
                self._per_chip[c] += 1

    def submitted(self) -> dict[int, int]:
        with self._lock:
            return dict(self._per_chip)


# ---------------------------------------------------------------------------
# Request accounting


class RequestBook:
    """The requests that ended (written by the traffic loop thread, read by the main and sampler threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.outstanding = 0
        self.by_outcome: Counter[str] = Counter()
        self.by_alias_outcome: dict[str, Counter[str]] = {}
        self.by_kind_outcome: dict[str, Counter[str]] = {}
        self.device_error_reasons: Counter[str] = Counter()
        self.cycle_outcomes: Counter[str] = Counter()
        self.cycle_e2e: dict[str, list[float]] = {}
        self.cycle_ttft: dict[str, list[float]] = {}
        self.latency: dict[str, evidence.Series] = {}
        self.ended: dict[str, evidence.Series] = {}  # the requests that did not succeed, by outcome (soak.png)

    def add(self, result: EngineResult, t: float) -> None:
        rec = result.record
        with self.lock:
            o = rec.outcome.value
            self.by_outcome[o] += 1
            self.cycle_outcomes[o] += 1
            self.by_alias_outcome.setdefault(rec.alias, Counter())[o] += 1
            self.by_kind_outcome.setdefault(rec.kind, Counter())[o] += 1
            if rec.outcome is RequestOutcome.DEVICE_ERROR:
                self.device_error_reasons[error_reason(rec.error)] += 1
            if rec.ok and rec.e2e is not None:
                self.cycle_e2e.setdefault(rec.alias, []).append(rec.e2e)
                self.latency.setdefault(rec.alias, evidence.Series()).add(t, rec.e2e)
                if rec.ttft is not None:
                    self.cycle_ttft.setdefault(rec.alias, []).append(rec.ttft)
            elif not rec.ok:
                self.ended.setdefault(o, evidence.Series()).add(t, rec.e2e if rec.e2e is not None else 0.0)

    def answered_in_cycle(self) -> dict[str, int]:
        """Per alias, the requests answered whole (outcome ``ok``) since the last unload."""
        with self.lock:
            return {alias: len(v) for alias, v in self.cycle_e2e.items()}

    def take_cycle(self) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
        with self.lock:
            outcomes = dict(self.cycle_outcomes)
            lat: dict[str, dict[str, Any]] = {}
            for alias in sorted(set(self.cycle_e2e) | set(self.cycle_ttft)):
                e2e = percentiles(self.cycle_e2e.get(alias, []))
                ttft = percentiles(self.cycle_ttft.get(alias, []))
                lat[alias] = {
                    "n": e2e.count,
                    "e2e_p50_ms": ms(e2e.p50),
                    "e2e_p99_ms": ms(e2e.p99),
                    "ttft_p50_ms": ms(ttft.p50),
                    "ttft_p99_ms": ms(ttft.p99),
                }
            self.cycle_outcomes = Counter()
            self.cycle_e2e, self.cycle_ttft = {}, {}
            return outcomes, lat


# ---------------------------------------------------------------------------
# The traffic: clients on the engine loop


@dataclass(eq=False)
class TrafficDriver:
    """The soak's clients on the engine loop: started once, running through every unload and load."""

    loop: EngineLoop
    engine: ServingEngine
    sup: DeviceSupervisor
    config: SoakConfig
    on_result: Callable[[GenerationRequest, EngineResult], None]
    requests: RequestBook
    _stop: threading.Event = field(default_factory=threading.Event)
    _futures: list[Any] = field(default_factory=list)

    def pools(self) -> dict[str, tuple[PoolPrompt, ...]]:
        """Per alias, the reference pool every client of it draws its prompts from (mix.py)."""
        return {alias: reference_pool(alias, self.limits(alias), seed=self.config.seed) for alias in self.sup.cores}

    def limits(self, alias: str) -> ModelLimits:
        return ModelLimits(self.engine.context_limit(alias), self.engine.codec(alias).vocab_size)

    def start(self) -> None:
        pools = self.pools()
        for alias in self.sup.cores:
            for i in range(self.config.clients_per_model):
                mix = MixedTraffic(alias, self.limits(alias), seed=self.config.seed, client=i, pool=pools[alias])
                self._futures.append(self.loop.submit(self._client(alias, mix, i)))

    async def _client(self, alias: str, mix: MixedTraffic, index: int) -> None:
        core = self.sup.cores[alias]
        pause = random.Random(f"{self.config.seed}/pause/{alias}/{index}")
        while not self._stop.is_set():
            req, plan = mix.next()
            with self.requests.lock:
                self.requests.sent += 1
                self.requests.outstanding += 1
            try:
                res = await drive_engine_request(
                    self.engine.submit,
                    req,
                    plan,
                    timeout_s=self.config.request_timeout_s,
                    served_generation=lambda: core.generation,
                )
            finally:
                with self.requests.lock:
                    self.requests.outstanding -= 1
            self.on_result(req, res)
            if res.record.outcome in (RequestOutcome.UNAVAILABLE, RequestOutcome.CAPACITY):
                await asyncio.sleep(pause.uniform(0.05, 0.15))  # back off while the model is away
            else:
                await asyncio.sleep(pause.uniform(0.0, 0.004))

    def stop(self, timeout_s: float) -> int:
        """Stop sending; wait for every client's request in flight to end. Returns clients still running."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        running = 0
        for f in self._futures:
            try:
                f.result(max(0.0, deadline - time.monotonic()))
            except Exception:
                if not f.done():
                    running += 1
                    f.cancel()
        self._futures = []
        return running
