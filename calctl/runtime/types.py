"""Values the runtime layer hands out: ids, enums and frozen records.

Shared by both backends and by every consumer (runners, serving engine, CLI).
Everything here is a value: nothing talks to a device, nothing is mutable.
``None`` in a numeric field means "the runtime cannot tell" (001 §14): it is
never replaced by 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import NewType

from calctl.runtime.errors import RuntimeStatus

JobId = NewType("JobId", int)
"""Board-wide job id, assigned by the runtime at submit (001 §14 ``job_id``)."""

GenerationId = NewType("GenerationId", int)
"""Caller-supplied ModelGeneration tag carried by every job, so stale completions are recognisable (000 §4, §10)."""

KvSeqId = NewType("KvSeqId", int)
"""A runtime KV sequence (000 §2 ``calrt::KvSeqId``); unique on the board while allocated."""


class DeviceKind(str, enum.Enum):
    MOCK = "mock"
    CALRT = "calrt"


class Engine(str, enum.Enum):
    """0.7.6 job engine selection (001 §2.2): a bank choice, not a CalCore affinity."""

    AUTO = "auto"
    PING = "ping"
    PONG = "pong"

    @property
    def code(self) -> int:
        """``CALRT_ENGINE_*``."""
        return {Engine.AUTO: 0, Engine.PING: 1, Engine.PONG: 2}[self]


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.ABORTED)

    @classmethod
    def from_code(cls, code: int) -> JobState:
        """From ``CALRT_JOB_*`` (declaration order); ValueError for a code the ABI does not define."""
        members = list(JobState)
        if not 0 <= code < len(members):
            raise ValueError(f"job state code {code}")
        return members[code]


class ResetScope(str, enum.Enum):
    """001 §7.1 reset domains the layer can ask for. 0.7.6 publicly has only the board one."""

    CHIP = "chip"
    BOARD = "board"

    @property
    def code(self) -> int:
        """``CALRT_RESET_*``."""
        return 1 if self is ResetScope.CHIP else 2


class Health(str, enum.Enum):
    OK = "ok"
    FAULTED = "faulted"  # a fault halted the chip; a reset of the fault's scope recovers it
    HUNG = "hung"  # a job never completes; only a reset releases it
    UNKNOWN = "unknown"  # the runtime cannot tell

    @classmethod
    def from_code(cls, code: int) -> Health:
        """From ``CALRT_HEALTH_*``; an unknown code is UNKNOWN."""
        members = list(Health)
        return members[code] if 0 <= code < len(members) else Health.UNKNOWN


@dataclass(frozen=True)
class Topology:
    """What the board is made of (001 §2.1–§2.2). ``dram_bytes[c]`` is None when not reported."""

    chips: int
    calcores_per_chip: int
    dram_bytes: tuple[int | None, ...]


@dataclass(frozen=True)
class Versions:
    runtime: str
    driver: str
    firmware: str
    abi: str
    #: The device is a software model (the mock, the reference board, a simulator), never hardware: every
    #: result produced on it is labelled so (docs/runtime.md §5). From the shim's identity extension
    #: (calrt_ext_device_identity), else its firmware string naming a "software model".
    software_model: bool = False


@dataclass(frozen=True)
class ChipMemory:
    """Per-chip DRAM in use (``GetMemoryUsage``). None: the runtime cannot tell for this chip (001 §14)."""

    chip: int
    used_bytes: int | None
    total_bytes: int | None


@dataclass(frozen=True)
class ChipCounters:
    """Per-chip job counters; they must close after a drain (001 §13.3). None: not reported."""

    chip: int
    pending: int | None
    finished: int | None
    failed: int | None


#: The per-chip telemetry fields of 001 §14, in the order ``device info`` shows them.
TELEMETRY_FIELDS = ("temperature_c", "power_w", "frequency_mhz", "throttled", "reset_count", "queue_depth")
#: The fields of the optional ``calrt_chip_telemetry`` call beyond 001 §14's (docs/calrt-c-abi.md §15): the limits
#: the chip throttles at, why it throttles, how long it has been throttled and its ECC counters.
TELEMETRY_EXTRA_FIELDS = (
    "temperature_limit_c",
    "power_limit_w",
    "frequency_max_mhz",
    "throttle_reasons",
    "throttled_s",
    "ecc_correctable",
    "ecc_uncorrectable",
)
ALL_TELEMETRY_FIELDS = TELEMETRY_FIELDS + TELEMETRY_EXTRA_FIELDS
#: ``calrt_chip_telemetry`` throttle reason bits, bit i = THROTTLE_REASONS[i] (docs/calrt-c-abi.md §15).
THROTTLE_REASONS = ("thermal", "power", "hw_slowdown", "host")


def throttle_reason_names(bits: int) -> tuple[str, ...]:
    """The names of the reason bits set in ``bits``; a bit past the table is ``bit<N>`` (conformance fails it)."""
    return tuple(THROTTLE_REASONS[i] if i < len(THROTTLE_REASONS) else f"bit{i}" for i in range(64) if bits >> i & 1)


@dataclass(frozen=True)
class ChipTelemetry:
    """001 §14 per-chip telemetry. None: the runtime cannot tell for this chip, and ``gaps`` names the field
    with why (a vendor gap, 001 §15): never 0 or a board-wide value standing in for the chip's own.

    Units are fixed (docs/calrt-c-abi.md §15): degrees Celsius, watts (averaged over up to a second), MHz, seconds;
    ``throttled_s``, ``ecc_correctable`` and ``ecc_uncorrectable`` are counters since the board powered on and
    never decrease; ``sample_ns`` is when the runtime read them (CLOCK_MONOTONIC)."""

    chip: int
    temperature_c: float | None = None
    power_w: float | None = None
    frequency_mhz: float | None = None
    throttled: bool | None = None
    reset_count: int | None = None
    queue_depth: int | None = None  # jobs submitted to the chip and not finished
    gaps: tuple[str, ...] = ()  # "field: why" for every None field
    temperature_limit_c: float | None = None  # where thermal throttling starts
    power_limit_w: float | None = None  # the chip's power cap
    frequency_max_mhz: float | None = None  # the unthrottled clock
    throttle_reasons: tuple[str, ...] | None = None  # THROTTLE_REASONS active now; () = not throttled
    throttled_s: float | None = None  # counter: seconds throttled
    ecc_correctable: int | None = None  # counter
    ecc_uncorrectable: int | None = None  # counter
    sample_ns: int | None = None

    def document(self) -> dict[str, object]:
        doc: dict[str, object] = {f: getattr(self, f) for f in ALL_TELEMETRY_FIELDS}
        if self.throttle_reasons is not None:
            doc["throttle_reasons"] = list(self.throttle_reasons)
        return {**doc, "vendor_gaps": list(self.gaps)}


def telemetry_gaps(t: ChipTelemetry, why: str) -> ChipTelemetry:
    """``t`` with every None field listed in ``gaps`` as ``"field: why"``."""
    gaps = tuple(f"{f}: {why}" for f in ALL_TELEMETRY_FIELDS if getattr(t, f) is None)
    return replace(t, gaps=gaps)


@dataclass(frozen=True)
class ChipHealth:
    chip: int
    health: Health
    detail: str | None = None


@dataclass(frozen=True)
class Job:
    """A submitted job: the handle ``wait``/``query`` take. Chips come from the graph, never the caller (001 §6.4)."""

    id: JobId
    graph: str
    model: str  # model alias owning the graph
    chips: tuple[int, ...]
    engine: Engine
    generation: GenerationId
    batch: int
    kv: tuple[KvSeqId | None, ...]
    submit_ns: int


@dataclass(frozen=True)
class JobResult:
    """Where a job is. ``status`` is the runtime code of a FAILED/ABORTED job, OK otherwise."""

    job: Job
    state: JobState
    status: RuntimeStatus
    start_ns: int | None
    end_ns: int | None
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.state is JobState.SUCCEEDED

    @property
    def device_seconds(self) -> float | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e9


class JobPhase(str, enum.Enum):
    """The three phases of a job on a chip (001 §14 ``h2d_ms, infer_ms, d2h_ms``)."""

    H2D = "h2d"  # inputs host -> device
    COMPUTE = "compute"
    D2H = "d2h"  # outputs device -> host


@dataclass(frozen=True)
class PhaseInterval:
    """When one phase of a job ran (``time.monotonic_ns()``)."""

    phase: JobPhase
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class TraceEvent:
    """One job interval on one chip (001 §13.2, §14). Times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC).

    ``phases``: the job's h2d/compute/d2h intervals in order, or None when the runtime does not report
    them (001 §14: unknown is None, never a made-up split). A phase that did not run is absent.
    """

    job: JobId
    chip: int
    model: str
    graph: str
    engine: Engine
    generation: GenerationId
    submit_ns: int
    start_ns: int | None
    end_ns: int | None
    state: JobState
    status: RuntimeStatus
    phases: tuple[PhaseInterval, ...] | None = None


@dataclass(frozen=True)
class KvLength:
    """A KV sequence's committed and reserved token counts (000 §9.2: committed <= reserved <= max_seq)."""

    committed: int
    reserved: int
