"""What the mock board keeps while it runs: a job in flight, a chip's state, an MCHIP job's hold on a chip.

:class:`MockJob` is a job from submit to its terminal transition (its buffers, KV sequences, phase log,
the faults decided for it); :class:`ChipState` one chip's queue, running banks, health, counters and its
place on the simulated device timeline; :class:`ChipHold` the placeholder that keeps a secondary chip of an
MCHIP graph busy while the job runs on its primary. Plain mutable records guarded by the board's lock;
nothing here runs a job (:mod:`.execution` does).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from calctl.runtime.buffers import HostBuffer
from calctl.runtime.calbin import GraphPlan
from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.mock import compute
from calctl.runtime.mock.faults import FaultDecision
from calctl.runtime.mock.kv import KvSequence
from calctl.runtime.mock.timing import PhaseSplit
from calctl.runtime.types import Health, Job, JobPhase, JobResult, JobState, PhaseInterval, ResetScope


class ChipHold:
    """An MCHIP job's placeholder in a secondary chip's queue: it occupies that chip while the job runs."""

    bank = "auto"

    def __init__(self, rec: MockJob, chip: int) -> None:
        self.rec = rec
        self.chip = chip
        self.acquired = threading.Event()


def _phase_units() -> dict[JobPhase, threading.Lock]:
    return {JobPhase.H2D: threading.Lock(), JobPhase.COMPUTE: threading.Lock(), JobPhase.D2H: threading.Lock()}


@dataclass(eq=False)  # a record is itself: compared and found by identity
class MockJob:
    """A job from submit to its terminal transition; what it leaves behind is its :class:`JobResult`."""

    job: Job
    plan: GraphPlan
    model: compute.LoadedModel | None  # None once finished: a finished job holds no weights
    inputs: HostBuffer
    outputs: HostBuffer
    seqs: list[KvSequence | None]
    bank: str
    phases: PhaseSplit  # scaled seconds per phase
    halting: FaultDecision | None
    corruptions: list[FaultDecision]
    phase_log: list[PhaseInterval] = field(default_factory=list)
    holds: list[ChipHold] = field(default_factory=list)
    state: JobState = JobState.QUEUED
    status: RuntimeStatus = RuntimeStatus.OK
    start_ns: int | None = None  # device timeline (docs/runtime.md "Job timestamps")
    end_ns: int | None = None
    dev_cursor_ns: int = 0  # device-timeline end of the job's last phase so far
    detail: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    abort: threading.Event = field(default_factory=threading.Event)
    abort_reason: str = "aborted"

    def result(self) -> JobResult:
        return JobResult(
            job=self.job,
            state=self.state,
            status=self.status,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            detail=self.detail,
        )


@dataclass(eq=False)
class ChipState:
    """One chip: its condition, queue and running banks, health and fault, counters, its place on the device timeline."""

    index: int
    # The chip's executor threads wait on this condition over the board lock: a submit to this chip, a bank of
    # it freed, its health restored wake only this chip's threads, never the whole board's.
    cv: threading.Condition
    queue: deque[MockJob | ChipHold] = field(default_factory=deque)
    running: dict[str, MockJob | ChipHold] = field(default_factory=dict)
    # One unit per phase: ping and pong share them, so their computes never overlap (000 §14).
    units: dict[JobPhase, threading.Lock] = field(default_factory=_phase_units)
    health: Health = Health.OK
    fault_scope: ResetScope | None = None
    fault_detail: str | None = None
    pending: int = 0
    finished: int = 0
    failed: int = 0
    leaked_bytes: int = 0
    resets: int = 0  # chip or board resets that covered this chip
    # The simulated device timeline: when each phase unit and each bank is next free (monotonic ns).
    unit_free_ns: dict[JobPhase, int] = field(default_factory=lambda: dict.fromkeys(JobPhase, 0))
    bank_free_ns: dict[str, int] = field(default_factory=lambda: {"auto": 0, "ping": 0, "pong": 0})


def job_of(item: MockJob | ChipHold) -> MockJob:
    return item.rec if isinstance(item, ChipHold) else item
