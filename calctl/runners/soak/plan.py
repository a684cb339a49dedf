"""``calctl soak``, the plan: what a soak is asked to do (:class:`SoakConfig`, checked on construction) and the
live view it offers a progress bar (:class:`SoakProgress`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from calctl import records
from calctl.errors import UsageError
from calctl.runners.device import DeviceSpec
from calctl.signing.policy import TrustPolicy


class Traffic(str, enum.Enum):
    MIXED = "mixed"  # the mix of soak.mix on every alias
    NONE = "none"  # load/unload cycles only


class Injection(str, enum.Enum):
    """Diagnostic injections that must make the soak fail (they prove its checkers)."""

    STALE_COMPLETION = "stale-completion"


@dataclass(frozen=True)
class SoakConfig:
    package: Path
    trust: TrustPolicy
    device: DeviceSpec
    out_dir: Path
    cycles: int | None = None
    hours: float | None = None
    traffic: Traffic = Traffic.MIXED
    traffic_seconds: float = 2.0
    traffic_requests: int = 4  # per alias and cycle: answered requests the traffic waits for (a floor)
    clients_per_model: int = 3
    inject: frozenset[Injection] = frozenset()
    seed: int = 0
    checkpoint_interval_s: float = 60.0
    sample_interval_s: float = 0.25
    warmup_iterations: int = 1
    drain_deadline_s: float = 30.0
    job_timeout_s: float = 30.0
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if (self.cycles is None) == (self.hours is None):
            raise UsageError("give exactly one of --cycles N and --hours H")
        if self.cycles is not None and self.cycles < 1:
            raise UsageError(f"--cycles {self.cycles}: at least 1")
        if self.hours is not None and not self.hours > 0:
            raise UsageError(f"--hours {self.hours}: expected a positive number")
        if not self.traffic_seconds >= 0:
            raise UsageError(f"--traffic-seconds {self.traffic_seconds}: expected >= 0")
        if self.traffic_requests < 0:
            raise UsageError(f"--traffic-requests {self.traffic_requests}: expected >= 0")
        if self.clients_per_model < 1:
            raise UsageError("--clients must be at least 1")
        if self.inject and self.traffic is Traffic.NONE:
            raise UsageError(
                "--inject needs traffic: the injected fault is only visible to requests (use --traffic mixed)"
            )
        if Injection.STALE_COMPLETION in self.inject and self.cycles is not None and self.cycles < 2:
            raise UsageError("--inject stale-completion needs at least 2 cycles: it fires after the first reload")
        if not self.checkpoint_interval_s > 0 or not self.sample_interval_s > 0:
            raise UsageError("checkpoint and sample intervals must be positive")


@dataclass(frozen=True)
class SoakProgress:
    """A live view for a progress bar (``on_progress``)."""

    phase: str  # loading | traffic | unloading | draining | done
    elapsed_s: float
    cycles_done: int
    cycles_total: int | None
    deadline_s: float | None
    requests: int  # sent; by_outcome counts them the one way (calctl.runners.soak.wording.RequestCounts)
    violations: int
    generation: int | None
    max_drift_mib: dict[int, float | None]
    by_outcome: dict[str, int] = field(default_factory=dict)  # the same counts the summary shows


def default_report_dir(now: datetime | None = None) -> Path:
    return records.default_report_dir("soak", now)
