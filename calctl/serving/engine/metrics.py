"""Prometheus metrics of the serving engine (000 §16, 001 §14).

Every family has the ``calctl_`` prefix and a unit suffix; counters end in
``_total``. Labels are bounded: model alias, generation, graph, queue class,
reason/outcome enums, tenant names from configuration and, on internal
families, chip. Request and job ids never become labels (they go to logs).
A per-chip figure the runtime cannot give is NaN, never 0 (001 §14).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from calctl.runtime.types import ALL_TELEMETRY_FIELDS, THROTTLE_REASONS, ChipTelemetry
from calctl.serving.config import ExecutorMode
from calctl.serving.record_sink import RecordSink

# Latency buckets from 5 ms to 480 s (000 §16: long prefills and queue waits must stay visible).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 240, 480)
FILL_BUCKETS = (0.0625, 0.125, 0.25, 0.5, 0.75, 1.0)


class EngineMetrics:
    def __init__(self, records: RecordSink | None = None) -> None:
        # 001 §14 per-request and per-job NDJSON records (calctl.serving.record_sink); disabled by default.
        self.records = records or RecordSink()
        self.registry = CollectorRegistry(auto_describe=True)
        # Every family registers here; latency histograms share LATENCY_BUCKETS unless they say otherwise.
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        histogram = functools.partial(Histogram, registry=self.registry, buckets=LATENCY_BUCKETS)
        self.requests = counter("calctl_requests_total", "Requests by terminal outcome.", ["model", "outcome"])
        self.admission = counter(
            "calctl_admission_decisions_total", "Admission decisions (000 §5.2).", ["model", "verdict"]
        )
        self.tokens = counter("calctl_generated_tokens_total", "Tokens delivered to clients.", ["model"])
        self.prompt_tokens = counter("calctl_prompt_tokens_total", "Prompt tokens admitted.", ["model"])
        self.tenant_tokens = counter(
            "calctl_tenant_service_tokens_total", "Tokens served per tenant (000 §5.3).", ["model", "tenant"]
        )
        self.jobs = counter("calctl_jobs_total", "Device jobs by graph kind and result.", ["model", "graph", "result"])
        self.device_errors = counter("calctl_device_errors_total", "Runtime errors by class.", ["model", "error"])
        self.jobs_submitted = counter(
            "calctl_jobs_submitted_total",
            "Device jobs the runtime accepted, per model and chip (the host side of the chip's job counters).",
            ["model", "chip"],
        )
        self.submit_busy = counter(
            "calctl_submit_busy_retries_total", "DeviceBusy at submit, retried with backoff.", ["model"]
        )
        self.stale = counter("calctl_stale_completions_total", "Completions dropped as stale (000 §4).", ["model"])
        self.audit = counter(
            "calctl_audit_probes_total",
            "Known-answer probes of the serving audit by result (pass, fail, skipped, error).",
            ["model", "result"],
        )
        self.recoveries = counter(
            "calctl_recoveries_total", "Recoveries by fault and reset scope.", ["model", "reason", "scope"]
        )
        self.lifecycle = histogram(
            "calctl_lifecycle_duration_seconds", "Load/configure/warmup/drain/unload durations.", ["model", "phase"]
        )
        self.ttft = histogram("calctl_ttft_seconds", "Time to first token.", ["model"])
        self.tpot = histogram("calctl_tpot_seconds", "Time per output token after the first.", ["model"])
        self.queue_time = histogram("calctl_queue_time_seconds", "Arrival to first device job.", ["model"])
        self.e2e = histogram("calctl_e2e_seconds", "Arrival to terminal event.", ["model"])
        self.job_seconds = histogram(
            "calctl_job_duration_seconds", "Device job duration (submit to completion).", ["model", "graph"]
        )
        self.batch_fill = histogram(
            "calctl_batch_fill_ratio", "Active lanes / compiled batch (000 §16).", ["model"], buckets=FILL_BUCKETS
        )
        # 000 §16 batch metrics: what the last decode job ran, and the padding lanes executed for nothing.
        self.compiled_batch = gauge("calctl_decode_compiled_batch", "Compiled batch of the last decode job.", ["model"])
        self.active_lanes = gauge("calctl_decode_active_lanes", "Active lanes of the last decode job.", ["model"])
        self.lane_waste = counter(
            "calctl_decode_lane_waste_total",
            "Decode lanes run without a request (compiled batch - active lanes), summed over jobs (000 §16).",
            ["model"],
        )
        # 000 §16 batch wait: how long the batching window held ready decode lanes before a decode job ran.
        self.batch_wait = histogram(
            "calctl_decode_batch_wait_seconds",
            "How long the batching window had been open when a decode batch fired (000 §7.2 rule 4).",
            ["model"],
        )
        # 000 §16 KV free latency: one released lane's runtime sequence freed and its lane confirmed Free.
        self.kv_free = histogram(
            "calctl_kv_free_latency_seconds",
            "Time to free a released KV lane (runtime free + scheduler confirm).",
            ["model"],
        )
        # 000 §16 fairness: a request whose deadline expired before it ever got a device job.
        self.starvation = counter(
            "calctl_starvation_events_total",
            "Requests whose deadline expired before their first device job, by prefill class (000 §16).",
            ["model", "queue"],
        )
        # 000 §16 recovery time: fault reported to recovery finished (the supervisor's RecoveryRecord).
        self.recovery_time = histogram(
            "calctl_recovery_duration_seconds",
            "Recovery duration per affected model, by reset scope and result.",
            ["model", "scope", "result"],
        )
        self.downgrades = counter(
            "calctl_executor_downgrades_total", "Executor mode downgrades (000 §14).", ["model", "reason"]
        )
        # Internal only (/metrics is never proxied publicly): which board this process owns (000 §3).
        self.board_info = gauge(
            "calctl_board_info",
            "1 for the board this process owns (one process per board, 000 §3).",
            ["board", "device"],
        )

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class SnapshotCollector(Collector):
    """Gauges computed at scrape time from the engine's snapshots (queues, KV, states, chips)."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        state = GaugeMetricFamily(
            "calctl_model_state", "1 for the alias's current lifecycle state (001 §11.1).", labels=["model", "state"]
        )
        gen = GaugeMetricFamily("calctl_model_generation", "Current ModelGeneration id.", labels=["model"])
        queue = GaugeMetricFamily("calctl_queue_depth", "Queued requests by class (000 §6).", labels=["model", "queue"])
        waiting = GaugeMetricFamily("calctl_waiting_requests", "Requests waiting for admission.", labels=["model"])
        waiting_tok = GaugeMetricFamily(
            "calctl_waiting_prompt_tokens", "Prompt tokens waiting for admission.", labels=["model"]
        )
        kv = GaugeMetricFamily("calctl_kv_lanes", "KV lanes by state (000 §9.1).", labels=["model", "state"])
        kv_tok = GaugeMetricFamily(
            "calctl_kv_reserved_tokens", "KV tokens reserved by admitted requests.", labels=["model"]
        )
        inflight = GaugeMetricFamily("calctl_executor_inflight_jobs", "Jobs in flight (000 §14).", labels=["model"])
        quarantined = GaugeMetricFamily(
            "calctl_quarantined_jobs", "Timed-out jobs whose buffers are held (000 §12).", labels=["model"]
        )
        mode = GaugeMetricFamily("calctl_executor_mode", "1 for the executor mode in use.", labels=["model", "mode"])
        oldest = GaugeMetricFamily(
            "calctl_queue_oldest_wait_seconds",
            "Longest current wait of a request queued in each class, 0 when empty (000 §16).",
            labels=["model", "queue"],
        )
        lane_wait = GaugeMetricFamily(
            "calctl_kv_lane_wait_seconds",
            "Longest current wait of a request for a KV lane (admission queue), 0 when none waits.",
            labels=["model"],
        )
        kv_used = GaugeMetricFamily(
            "calctl_kv_used_tokens", "KV tokens written (committed) in the lanes (000 §16).", labels=["model"]
        )
        lag = GaugeMetricFamily(
            "calctl_tenant_virtual_lag",
            "WFQ virtual time of a configured tenant ahead of the system's (000 §5.3, §16).",
            labels=["model", "tenant"],
        )
        quota_used = GaugeMetricFamily(
            "calctl_tenant_quota_used",
            "A configured tenant's use of its quota: active sequences or waiting prompt tokens (000 §5.3).",
            labels=["model", "tenant", "quota"],
        )
        quota_limit = GaugeMetricFamily(
            "calctl_tenant_quota_limit",
            "A configured tenant's quota (+Inf = no limit configured).",
            labels=["model", "tenant", "quota"],
        )
        mem = GaugeMetricFamily(
            "calctl_chip_memory_used_bytes", "Per-chip DRAM in use (internal; NaN = not reported).", labels=["chip"]
        )
        memt = GaugeMetricFamily(
            "calctl_chip_memory_total_bytes", "Per-chip DRAM size (internal; NaN = not reported).", labels=["chip"]
        )
        for m in snap.models:
            for s in ALL_STATES:
                state.add_metric([m.alias, s], 1.0 if s == m.state else 0.0)
            gen.add_metric([m.alias], float(m.generation) if m.generation is not None else math.nan)
            for q, depth in m.queues.items():
                queue.add_metric([m.alias, q], float(depth))
            waiting.add_metric([m.alias], float(m.waiting_requests))
            waiting_tok.add_metric([m.alias], float(m.waiting_prompt_tokens))
            for s, n in m.kv_lanes.items():
                kv.add_metric([m.alias, s], float(n))
            kv_tok.add_metric([m.alias], float(m.kv_reserved_tokens))
            inflight.add_metric([m.alias], float(m.inflight_jobs))
            quarantined.add_metric([m.alias], float(m.quarantined_jobs))
            for name in EXECUTOR_MODES:  # every mode, 0 or 1, so a downgrade shows as a flip (000 §14)
                mode.add_metric([m.alias, name], 1.0 if name == m.executor_mode else 0.0)
            for q, wait in m.oldest_wait.items():
                oldest.add_metric([m.alias, q], wait)
            lane_wait.add_metric([m.alias], m.lane_wait_s)
            kv_used.add_metric([m.alias], float(m.kv_used_tokens))
            for t in m.tenants:
                lag.add_metric([m.alias, t.tenant], t.virtual_lag)
                for quota, used, limit in (
                    ("active_sequences", t.active, t.max_active),
                    ("waiting_tokens", t.waiting_tokens, t.max_waiting_tokens),
                ):
                    quota_used.add_metric([m.alias, t.tenant, quota], float(used))
                    quota_limit.add_metric([m.alias, t.tenant, quota], math.inf if limit is None else float(limit))
        for c in snap.chips:
            mem.add_metric([str(c.chip)], math.nan if c.used_bytes is None else float(c.used_bytes))
            memt.add_metric([str(c.chip)], math.nan if c.total_bytes is None else float(c.total_bytes))
        yield from (state, gen, queue, waiting, waiting_tok, kv, kv_tok, inflight, quarantined, mode)
        yield from (oldest, lane_wait, kv_used, lag, quota_used, quota_limit, mem, memt)
        yield from chip_telemetry_families([(c.chip, c.telemetry) for c in snap.chips])


def chip_telemetry_families(chips: Iterable[tuple[int, ChipTelemetry | None]]) -> list[Metric]:
    """001 §14 per-chip telemetry as Prometheus families (``/metrics`` and ``calctl device watch --prometheus``):
    NaN where the runtime cannot tell (never 0), the gap as its own series; the ECC and throttled-time counters
    as counters, the active throttle reasons as one 0/1 series per reason (docs/calrt-c-abi.md §15)."""
    tel = {
        f: GaugeMetricFamily(name, f"{what} (internal; NaN = not reported).", labels=["chip"])
        for f, (name, what) in CHIP_TELEMETRY_GAUGES.items()
    }
    gaps = GaugeMetricFamily(
        "calctl_chip_telemetry_gap",
        "1 for a per-chip telemetry field the runtime cannot report (vendor gap, 001 §14).",
        labels=["chip", "field"],
    )
    ecc = CounterMetricFamily(
        "calctl_chip_ecc_errors", "Memory errors of the chip since power-on, by kind.", labels=["chip", "kind"]
    )
    throttled = CounterMetricFamily("calctl_chip_throttled_seconds", "Time the chip spent throttled.", labels=["chip"])
    reason = GaugeMetricFamily(
        "calctl_chip_throttle_reason",
        "1 while the reason throttles the chip (docs/calrt-c-abi.md §15).",
        labels=["chip", "reason"],
    )
    for chip, t in chips:
        label = str(chip)
        for f in ALL_TELEMETRY_FIELDS:
            v = getattr(t, f) if t is not None else None
            if f in tel:
                tel[f].add_metric([label], math.nan if v is None else float(v))
            if v is None:
                gaps.add_metric([label, f], 1.0)
        if t is not None:
            for kind, n in (("correctable", t.ecc_correctable), ("uncorrectable", t.ecc_uncorrectable)):
                if n is not None:
                    ecc.add_metric([label, kind], float(n))
            if t.throttled_s is not None:
                throttled.add_metric([label], t.throttled_s)
            if t.throttle_reasons is not None:
                for r in THROTTLE_REASONS:
                    reason.add_metric([label, r], 1.0 if r in t.throttle_reasons else 0.0)
    return [*tel.values(), gaps, ecc, throttled, reason]


CHIP_TELEMETRY_GAUGES = {
    "temperature_c": ("calctl_chip_temperature_celsius", "Per-chip temperature"),
    "power_w": ("calctl_chip_power_watts", "Per-chip power"),
    "frequency_mhz": ("calctl_chip_frequency_mhz", "Per-chip clock frequency"),
    "throttled": ("calctl_chip_throttled", "1 while the chip is throttled"),
    "reset_count": ("calctl_chip_resets", "Resets that covered the chip"),
    "queue_depth": ("calctl_chip_queue_depth", "Jobs submitted to the chip and not finished"),
    "temperature_limit_c": ("calctl_chip_temperature_limit_celsius", "Per-chip thermal throttling limit"),
    "power_limit_w": ("calctl_chip_power_limit_watts", "Per-chip power cap"),
    "frequency_max_mhz": ("calctl_chip_frequency_max_mhz", "Per-chip unthrottled clock"),
}


EXECUTOR_MODES = tuple(m.value for m in ExecutorMode)
ALL_STATES = (
    "Unloaded",
    "Validating",
    "Configuring",
    "Warming",
    "Ready",
    "Draining",
    "Unloading",
    "Recovering",
    "Failed",
)


class TenantSnapshot:
    """One configured tenant (never a name taken from a request: bounded cardinality, 000 §16)."""

    __slots__ = ("active", "max_active", "max_waiting_tokens", "tenant", "virtual_lag", "waiting_tokens")

    def __init__(
        self,
        tenant: str,
        virtual_lag: float,
        active: int,
        max_active: int | None,
        waiting_tokens: int,
        max_waiting_tokens: int | None,
    ) -> None:
        self.tenant, self.virtual_lag = tenant, virtual_lag
        self.active, self.max_active = active, max_active
        self.waiting_tokens, self.max_waiting_tokens = waiting_tokens, max_waiting_tokens


class ModelSnapshot:
    __slots__ = (
        "alias",
        "executor_mode",
        "generation",
        "inflight_jobs",
        "kv_lanes",
        "kv_reserved_tokens",
        "kv_used_tokens",
        "lane_wait_s",
        "oldest_wait",
        "quarantined_jobs",
        "queues",
        "state",
        "tenants",
        "waiting_prompt_tokens",
        "waiting_requests",
    )

    def __init__(
        self,
        alias: str,
        state: str,
        generation: int | None,
        queues: dict[str, int],
        waiting_requests: int,
        waiting_prompt_tokens: int,
        kv_lanes: dict[str, int],
        kv_reserved_tokens: int,
        inflight_jobs: int,
        quarantined_jobs: int,
        executor_mode: str,
        *,
        oldest_wait: dict[str, float] | None = None,
        lane_wait_s: float = 0.0,
        kv_used_tokens: int = 0,
        tenants: list[TenantSnapshot] | None = None,
    ) -> None:
        self.oldest_wait, self.lane_wait_s, self.kv_used_tokens = oldest_wait or {}, lane_wait_s, kv_used_tokens
        self.tenants = tenants or []
        self.alias, self.state, self.generation = alias, state, generation
        self.queues, self.waiting_requests, self.waiting_prompt_tokens = queues, waiting_requests, waiting_prompt_tokens
        self.kv_lanes, self.kv_reserved_tokens = kv_lanes, kv_reserved_tokens
        self.inflight_jobs, self.quarantined_jobs, self.executor_mode = inflight_jobs, quarantined_jobs, executor_mode


class ChipSnapshot:
    __slots__ = ("chip", "telemetry", "total_bytes", "used_bytes")

    def __init__(
        self, chip: int, used_bytes: int | None, total_bytes: int | None, telemetry: ChipTelemetry | None = None
    ) -> None:
        self.chip, self.used_bytes, self.total_bytes = chip, used_bytes, total_bytes
        self.telemetry = telemetry  # None: the runtime's telemetry() failed, every field is a gap


class EngineSnapshot:
    __slots__ = ("chips", "models")

    def __init__(self, models: list[ModelSnapshot], chips: list[ChipSnapshot]) -> None:
        self.models, self.chips = models, chips
