"""What one alias's scheduler is configured with (000 §15 blocks; built by ``calctl.serving.config``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from calctl.serving.core.admission import AdmissionPolicy, CapacityBudget
from calctl.serving.core.decode import DEFAULT_MAX_TENANT_LANE_SHARE, BatchProfile
from calctl.serving.core.prefill import PrefillThresholds, ServiceWeights


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """000 §7.2 / §8 knobs (``batch`` block of 000 §15)."""

    batching_window_s: float = 0.0
    profile_thresholds: Mapping[int, int] | None = None
    max_tenant_lane_share: float = DEFAULT_MAX_TENANT_LANE_SHARE
    deadline_granularity_s: float = 0.0
    step_estimate_s: float = 0.0  # the floor under the measured decode step time (batch.step_estimate_floor_us)


@dataclass(frozen=True, slots=True)
class LongPrefillQuota:
    """000 §6 / 001 §9.3 "limit the admission and concurrency of long prefills" (``queues`` block).

    A long prompt is one above ``medium_prefill_max_tokens`` (the long prefill queue). ``max_waiting``
    caps the long requests accepted whose prefill has not started (queued for admission, waiting for the
    model, or PrefillReady): one more is refused with 429. ``max_running`` caps long prefill jobs in flight
    at once (only matters with two in flight, ping/pong): the arbiter skips the long queue while it is
    reached. None: no cap."""

    max_waiting: int | None = None
    max_running: int | None = 1

    def __post_init__(self) -> None:
        for name in ("max_waiting", "max_running"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"long prefill {name} must be >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Everything one alias's scheduler needs; built by ``calctl.serving.config`` from YAML + package + budget."""

    budget: CapacityBudget
    max_seq: int
    admission: AdmissionPolicy
    prefill_graph: str
    profiles: tuple[BatchProfile, ...]
    prefill_thresholds: PrefillThresholds = PrefillThresholds()
    service_weights: ServiceWeights = ServiceWeights()
    decode: DecodeOptions = DecodeOptions()
    remove_tail: bool = False
    long_prefill: LongPrefillQuota = LongPrefillQuota()


__all__ = ["DecodeOptions", "LongPrefillQuota", "SchedulerSettings"]
