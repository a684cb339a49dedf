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


class MockJob:
    def __init__(
        self,
        job: Job,
        plan: GraphPlan,
        model: compute.LoadedModel,
        inputs: HostBuffer,
        outputs: HostBuffer,
        seqs: list[KvSequence | None],
        bank: str,
        phases: PhaseSplit,
        halting: FaultDecision | None,
        corruptions: list[FaultDecision],
    ) -> None:
        self.job = job
        self.plan = plan
        self.model: compute.LoadedModel | None = model  # None once finished: a finished job holds no weights
        self.inputs = inputs
        self.outputs = outputs
        self.seqs = seqs
        self.bank = bank
        self.phases = phases  # scaled seconds per phase
        self.phase_log: list[PhaseInterval] = []
        self.halting = halting
        self.corruptions = corruptions
        self.holds: list[ChipHold] = []
        self.state = JobState.QUEUED
        self.status = RuntimeStatus.OK
        self.start_ns: int | None = None  # device timeline (see the module docstring)
        self.end_ns: int | None = None
        self.dev_cursor_ns = 0  # device-timeline end of the job's last phase so far
        self.detail: str | None = None
        self.done = threading.Event()
        self.abort = threading.Event()
        self.abort_reason = "aborted"

    def result(self) -> JobResult:
        return JobResult(
            job=self.job,
            state=self.state,
            status=self.status,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            detail=self.detail,
        )


class ChipState:
    def __init__(self, index: int) -> None:
        self.index = index
        self.queue: deque[MockJob | ChipHold] = deque()
        self.running: dict[str, MockJob | ChipHold] = {}
        # One unit per phase: ping and pong share them, so their computes never overlap (000 §14).
        self.units = {
            JobPhase.H2D: threading.Lock(),
            JobPhase.COMPUTE: threading.Lock(),
            JobPhase.D2H: threading.Lock(),
        }
        self.health = Health.OK
        self.fault_scope: ResetScope | None = None
        self.fault_detail: str | None = None
        self.pending = 0
        self.finished = 0
        self.failed = 0
        self.leaked_bytes = 0
        self.resets = 0  # chip or board resets that covered this chip
        # The simulated device timeline: when each phase unit and each bank is next free (monotonic ns).
        self.unit_free_ns = {JobPhase.H2D: 0, JobPhase.COMPUTE: 0, JobPhase.D2H: 0}
        self.bank_free_ns: dict[str, int] = {"auto": 0, "ping": 0, "pong": 0}


def job_of(item: MockJob | ChipHold) -> MockJob:
    return item.rec if isinstance(item, ChipHold) else item
