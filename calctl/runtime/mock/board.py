"""The mock board: an in-process Calculet board with CalRT 0.7.6 semantics (docs/runtime.md).

What it keeps from 0.7.6 (001 §2.1–§2.5):

* one physical device per process: opening a second while one is open raises
  :class:`DeviceInUse`;
* one current calbin: ``configure`` while one is current raises
  :class:`AlreadyConfigured`; ``reset_configuration`` drops it;
* ``submit`` has no chip argument: the graph's target chips decide (001 §6.4).

What it simulates:

* chips that really run in parallel: every chip has its own FIFO queue and two
  executor threads (one per ping/pong bank). An ``auto`` job runs alone on its
  chip; a ``ping`` and a ``pong`` job may be in flight together (two-deep, 001
  §9.3, 000 §14). A job runs in phases (h2d, compute, d2h; ``timing.py``) and a
  chip has one unit of each, so ping and pong overlap one's transfers with the
  other's compute but never compute at the same time: two in flight is not two
  computing, and the trace records each phase. An MCHIP graph holds all its chips at once. ``serialize_chips``
  adds one board-wide lock around execution, modelling a global runtime lock,
  so tools can be shown telling S1 from S2 (001 §1, §13.2);
* per-chip DRAM: firmware reserve + the package's memory plan per chip (+ any
  leaked bytes); ``configure`` raises :class:`OutOfMemory` when a chip's plan
  does not fit (001 §8: each chip on its own, never the board total);
* time: each job sleeps its :class:`TimingModel` phases x ``time_scale``,
  minus the numpy compute already spent in the compute phase (the sleep
  releases the GIL);
* the device's own clock: a job's ``start_ns``/``end_ns`` (and its phase
  intervals) are stamps on a simulated per-chip timeline, as a real runtime
  stamps jobs on the device: a job starts when it was submitted or when its
  chip (its bank, its phase unit, the board lock under ``serialize_chips``)
  became free on that timeline, whichever is later, and each phase lasts its
  modelled seconds. How late the host's scheduler runs the thread that
  simulates a job moves the wall-clock moment ``wait`` returns, never these
  stamps, so figures computed from them describe the modelled chips and the
  host's delay shows up only as host overhead (docs/runtime.md "Job
  timestamps");
* compute: the package's tiny decoder with a real KV cache per sequence;
* faults from a seeded :class:`FaultPlan` (``faults.py``), each halting fault
  with a chip or board reset scope (001 §11.3, §13.4);
* a per-chip trace of job intervals and per-chip counters.

Recovery: ``reset("chip", chip=c)`` aborts chip c's jobs, empties its models'
KV sequences and clears its fault, keeping the configuration; a fault whose
scope is ``board`` refuses a chip reset (DeviceLost). ``reset("board")`` aborts
everything, drops the configuration and reclaims every byte, leaks included.
The mock grants both scopes by default; ``reset_scopes=("board",)`` models a
runtime with only a board reset.

Mock results are mock results: nothing here is evidence about a board (docs/runtime.md §5).
This module does not parse packages (``calctl.package``) or fault-plan YAML.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calctl.errors import ConfigError
from calctl.package.model import GraphKind, Package
from calctl.runtime.bookkeeping import DeviceBookkeeping
from calctl.runtime.buffers import Direction, HostBuffer, buffer_layout
from calctl.runtime.calbin import Calbin, GraphPlan, plan_calbin
from calctl.runtime.errors import (
    AlreadyConfigured,
    DeviceBusy,
    DeviceInUse,
    DeviceLost,
    InvalidArgument,
    NotConfigured,
    NotSupported,
    OutOfMemory,
    RuntimeStatus,
)
from calctl.runtime.mock import compute
from calctl.runtime.mock.faults import FaultDecision, FaultInjector, FaultKind, FaultPlan, FaultRule, InjectedFault
from calctl.runtime.mock.kv import KvSequence, MockKvManager
from calctl.runtime.mock.timing import PhaseSplit, TimingModel
from calctl.runtime.types import (
    ChipCounters,
    ChipHealth,
    ChipMemory,
    ChipTelemetry,
    DeviceKind,
    Engine,
    GenerationId,
    Health,
    Job,
    JobId,
    JobPhase,
    JobResult,
    JobState,
    KvSeqId,
    PhaseInterval,
    ResetScope,
    Topology,
    Versions,
    telemetry_gaps,
)

GIB = 1024**3
MIB = 1024**2

# One physical device per process (001 §2.1: VirtualDevice "temporary only support one physical device").
_PROCESS_LOCK = threading.Lock()
_PROCESS_DEVICE: MockRuntime | None = None


@dataclass(frozen=True)
class MockBoardConfig:
    """The simulated board. Defaults: 2 chips x 2 CalCores x 16 GiB (the reference board class, 001 §3)."""

    chips: int = 2
    calcores_per_chip: int = 2
    chip_dram_bytes: int = 16 * GIB
    firmware_reserved_bytes: int = 64 * MIB  # per chip, in use before any calbin: the memory baseline
    timing: TimingModel = field(default_factory=TimingModel)
    time_scale: float = 1.0
    serialize_chips: bool = False
    fault_plan: FaultPlan = field(default_factory=FaultPlan)
    seed: int | None = None  # overrides the fault plan's seed
    reset_scopes: tuple[ResetScope, ...] = (ResetScope.CHIP, ResetScope.BOARD)
    max_queue_depth: int = 64  # per chip, queued + running; beyond it submit raises DeviceBusy
    history: int = 65536  # finished jobs (and trace events) kept for wait/query/trace

    def __post_init__(self) -> None:
        if not 1 <= self.chips <= 16:
            raise ConfigError(f"mock board: chips must be 1..16, got {self.chips}")
        if self.calcores_per_chip < 1:
            raise ConfigError(f"mock board: calcores_per_chip must be >= 1, got {self.calcores_per_chip}")
        if self.chip_dram_bytes < self.firmware_reserved_bytes or self.firmware_reserved_bytes < 0:
            raise ConfigError("mock board: chip_dram_bytes must hold firmware_reserved_bytes")
        if not self.time_scale >= 0:
            raise ConfigError(f"mock board: time_scale must be >= 0, got {self.time_scale}")
        if self.max_queue_depth < 1 or self.history < 16:
            raise ConfigError("mock board: max_queue_depth must be >= 1 and history >= 16")
        if not self.reset_scopes:
            raise ConfigError("mock board: at least one reset scope (board) must be granted")


class _Hold:
    """An MCHIP job's placeholder in a secondary chip's queue: it occupies that chip while the job runs."""

    bank = "auto"

    def __init__(self, rec: _JobRecord, chip: int) -> None:
        self.rec = rec
        self.chip = chip
        self.acquired = threading.Event()


class _JobRecord:
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
        self.holds: list[_Hold] = []
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


class _Chip:
    def __init__(self, index: int) -> None:
        self.index = index
        self.queue: deque[_JobRecord | _Hold] = deque()
        self.running: dict[str, _JobRecord | _Hold] = {}
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


def _item_record(item: _JobRecord | _Hold) -> _JobRecord:
    return item.rec if isinstance(item, _Hold) else item


class MockRuntime(DeviceBookkeeping[_JobRecord, dict[str, compute.LoadedModel]]):
    """The mock board; implements :class:`calctl.runtime.interface.Runtime`. Open it with ``open_runtime("mock")``."""

    kind = DeviceKind.MOCK

    def __init__(self, config: MockBoardConfig | None = None) -> None:
        global _PROCESS_DEVICE
        self.config = config or MockBoardConfig()
        with _PROCESS_LOCK:
            if _PROCESS_DEVICE is not None:
                raise DeviceInUse(
                    "the mock board is already open in this process (CalRT 0.7.6: one physical device per process, 001 §2.1)",
                    hint="close the other runtime first (use `with open_runtime(...)`)",
                )
            _PROCESS_DEVICE = self
        try:
            self._setup()
        except BaseException:
            with _PROCESS_LOCK:
                _PROCESS_DEVICE = None
            raise

    def _setup(self) -> None:
        self._cv = threading.Condition(threading.RLock())
        self._init_bookkeeping(self._cv, self.config.history)
        self._serial = threading.Lock()
        self._serial_free_ns = 0  # device timeline of the modelled global lock
        self._chips = [_Chip(i) for i in range(self.config.chips)]
        # Chips a reset is under way on: it waits for their running jobs with the lock released, and a job
        # submitted to them meanwhile would survive the reset (and run on what it cleared), so submit refuses.
        self._resetting: set[int] = set()
        self._kv = MockKvManager(self._cv)
        self._faults = FaultInjector(self.config.fault_plan, self.config.seed)
        self._job_ids = itertools.count(1)
        # Jobs in flight (queued or running). A finished job leaves it: only its JobResult is kept, in
        # _finished, for wait/query (the last `history` of them); no buffer, KV sequence or weights stay
        # reachable from a finished job, so host memory does not grow with the requests served.
        self._jobs: dict[JobId, _JobRecord] = {}
        self._finished: OrderedDict[JobId, JobResult] = OrderedDict()
        self._host_leaks: list[bytearray] = []  # host_memory_leak faults: kept for the life of the board
        self._threads = [
            threading.Thread(target=self._worker, args=(chip,), name=f"mock-chip{chip.index}-bank{b}", daemon=True)
            for chip in self._chips
            for b in range(2)
        ]
        for t in self._threads:
            t.start()

    # -- device ------------------------------------------------------------------

    def close(self) -> None:
        global _PROCESS_DEVICE
        with self._cv:
            if self._closed:
                return
            self._closed = True
            running = self._abort_chips(set(range(self.config.chips)), "aborted: the device was closed")
            self._cv.notify_all()
        for rec in running:
            rec.done.wait()
        for t in self._threads:
            t.join()
        with self._cv:
            for buf in self._buffers.values():
                buf.mark_released()
            self._buffers.clear()
            self._kv.drop_all()
            self._current = None
            self._calbins.clear()
        with _PROCESS_LOCK:
            if _PROCESS_DEVICE is self:
                _PROCESS_DEVICE = None

    def topology(self) -> Topology:
        c = self.config
        return Topology(chips=c.chips, calcores_per_chip=c.calcores_per_chip, dram_bytes=(c.chip_dram_bytes,) * c.chips)

    def versions(self) -> Versions:
        # The mock keeps CalRT 0.7.6 semantics; the firmware string says what it really is.
        return Versions(runtime="0.7.6", driver="1.0.0", firmware="mock", abi="1.0", software_model=True)

    # -- calbin / configuration ----------------------------------------------------

    def create_calbin(self, package: Package) -> Calbin:
        self._check_open()
        plan = plan_calbin(package, self.topology())
        models = {alias: compute.load_model(package, mp.model) for alias, mp in plan.models.items()}
        with self._cv:
            self._check_open()
            calbin = Calbin(plan, next(self._calbin_ids), self._release_calbin)
            self._calbins[calbin.id] = (calbin, models)
            return calbin

    def configure(self, calbin: Calbin) -> None:
        with self._cv:
            self._check_open()
            models = self._calbin_entry(calbin, refuse_released=True)
            if self._current is not None:
                raise AlreadyConfigured(
                    f"calbin {self._current.id} ({self._current.package.name!r}) is current; "
                    "0.7.6 keeps one current calbin (001 §2.4)",
                    hint="reset_configuration() first (a combined package reconfigures as a whole, 001 §11.2)",
                )
            self._check_board_healthy("configure")
            plan = calbin.plan
            for chip in self._chips:
                need = plan.chip_plan_bytes[chip.index]
                in_use = self.config.firmware_reserved_bytes + chip.leaked_bytes
                if in_use + need > self.config.chip_dram_bytes:
                    raise OutOfMemory(
                        f"chip {chip.index}: the memory plan needs {need} bytes, {in_use} are in use "
                        f"({chip.leaked_bytes} leaked), the chip has {self.config.chip_dram_bytes} (001 §8)"
                    )
            self._kv.install({alias: (models[alias], mp.chips) for alias, mp in plan.models.items()})
            self._current = calbin

    def reset_configuration(self) -> None:
        with self._cv:
            self._check_open()
            if self._current is None:
                raise NotConfigured("no calbin is configured")
            inflight = list(self._jobs)
            if inflight:
                raise DeviceBusy(
                    f"{len(inflight)} job(s) in flight ({', '.join(map(str, inflight[:8]))}); "
                    "drain them (wait) or reset the device first (000 §12)"
                )
            self._unload(self._current, inject_leaks=True)

    def _unload(self, calbin: Calbin, *, inject_leaks: bool) -> None:
        if inject_leaks:
            for alias, mp in calbin.plan.models.items():
                for d in self._faults.on_unload(model=alias, chips=mp.chips):
                    if d.rule.kind is FaultKind.HOST_MEMORY_LEAK:  # the process keeps it; the device counters do not
                        self._host_leaks.append(_touched(d.rule.leak_bytes or 0))
                        self._faults.record(d, job=None, graph=None, model=alias, chips=mp.chips)
                        continue
                    for chip in mp.chips:
                        leak = d.rule.leak_bytes if d.rule.leak_bytes is not None else mp.plan_bytes.get(chip, 0)
                        self._chips[chip].leaked_bytes += leak
                    self._faults.record(d, job=None, graph=None, model=alias, chips=mp.chips)
        self._kv.drop_all()
        self._unconfigured()

    # -- buffers -----------------------------------------------------------------------

    def _alloc(self, graph: str, direction: Direction, batch: int) -> HostBuffer:
        with self._cv:
            self._check_open()
            plan = self._graph(graph)
            layout = buffer_layout(plan.graph, direction, batch)
            buf = HostBuffer(next(self._buffer_ids), layout, np.zeros(layout.nbytes, np.uint8))
            self._buffers[buf.id] = buf
            return buf

    # -- jobs ------------------------------------------------------------------------

    def _submit(
        self,
        model_name: str,
        inputs: HostBuffer,
        outputs: HostBuffer,
        eng: Engine,
        lanes: tuple[KvSeqId | None, ...],
        generation: GenerationId,
    ) -> Job:
        with self._cv:
            plan = self._submit_plan(model_name, inputs, outputs, lanes)
            seqs, tokens, kv_tokens = self._bind_kv(plan, inputs, lanes)
            if self._resetting.intersection(plan.chips):
                raise DeviceBusy(
                    f"chip(s) {', '.join(map(str, sorted(self._resetting.intersection(plan.chips))))} "
                    "are being reset; submit after the reset returns"
                )
            for c in plan.chips:
                chip = self._chips[c]
                if chip.health is Health.FAULTED:
                    raise DeviceLost(
                        f"chip {c} is halted: {chip.fault_detail}",
                        hint=f"reset the {chip.fault_scope.value if chip.fault_scope else 'chip'}",
                    )
            primary = self._chips[plan.chips[0]]
            if len(primary.queue) + len(primary.running) >= self.config.max_queue_depth:
                raise DeviceBusy(f"chip {primary.index}'s job queue is full ({self.config.max_queue_depth} jobs)")

            decisions = self._faults.on_submit(graph=plan.name, model=plan.model, chips=plan.chips)
            busy = next((d for d in decisions if d.rule.kind is FaultKind.DEVICE_BUSY), None)
            if busy is not None:
                self._faults.record(busy, job=None, graph=plan.name, model=plan.model, chips=plan.chips)
                raise DeviceBusy(
                    f"submit of {plan.name!r} refused (injected device_busy, rule {busy.rule_index}, event {busy.ordinal})"
                )
            halting = next((d for d in decisions if d.rule.kind.halts_chip), None)
            corruptions = [d for d in decisions if d.rule.kind in (FaultKind.CORRUPT_OUTPUT, FaultKind.KV_CORRUPTION)]

            job_id = JobId(next(self._job_ids))
            job = Job(
                id=job_id,
                graph=plan.name,
                model=plan.model,
                chips=plan.chips,
                engine=eng,
                generation=generation,
                batch=inputs.batch,
                kv=lanes,
                submit_ns=time.monotonic_ns(),
            )
            for d in ([halting] if halting else []) + corruptions:
                self._faults.record(d, job=job_id, graph=plan.name, model=plan.model, chips=plan.chips)
            split = self.config.timing.phases(plan.name, plan.kind, plan.chips[0], tokens=tokens, kv_tokens=kv_tokens)
            bank = "auto" if len(plan.chips) > 1 or eng is Engine.AUTO else eng.value
            model = self._calbins[self._current.id][1][plan.model] if self._current else None
            assert model is not None
            rec = _JobRecord(
                job,
                plan,
                model,
                inputs,
                outputs,
                seqs,
                bank,
                split.scaled(self.config.time_scale),
                halting,
                corruptions,
            )
            inputs.lend(job_id)
            outputs.lend(job_id)
            for s in seqs:
                if s is not None:
                    s.busy_job = job_id
                    s.last_job_failed = False
            primary.queue.append(rec)
            for c in plan.chips[1:]:
                hold = _Hold(rec, c)
                rec.holds.append(hold)
                self._chips[c].queue.append(hold)
            for c in plan.chips:
                self._chips[c].pending += 1
            self._jobs[job_id] = rec
            self._cv.notify_all()
        return job

    def wait(self, job: Job, timeout: float) -> JobResult:
        rec = self._record(job)
        if isinstance(rec, JobResult):
            return self._result_or_raise(rec)
        if not rec.done.wait(max(0.0, timeout)):
            raise self._wait_timeout(job, timeout)
        return self._result_or_raise(rec.result())

    def wait_any(self, jobs: Iterable[Job], timeout: float) -> list[Job]:
        records = [self._record(j) for j in jobs]
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cv:
            while True:
                done = [r.job for r in records if r.state.terminal]
                remaining = deadline - time.monotonic()
                if done or remaining <= 0 or not records:
                    return done
                self._cv.wait(remaining)

    def query(self, job: Job) -> JobResult:
        rec = self._record(job)
        with self._cv:
            return rec if isinstance(rec, JobResult) else rec.result()

    def _record(self, job: Job) -> _JobRecord | JobResult:
        with self._cv:
            rec: _JobRecord | JobResult | None = self._jobs.get(job.id) or self._finished.get(job.id)
            if rec is None or rec.job != job:
                raise self._unknown_job(job)
            return rec

    # -- KV / observation ----------------------------------------------------------

    @property
    def kv(self) -> MockKvManager:
        return self._kv

    def memory_usage(self) -> tuple[ChipMemory, ...]:
        with self._cv:
            plan = self._current.plan.chip_plan_bytes if self._current else (0,) * self.config.chips
            return tuple(
                ChipMemory(
                    chip=c.index,
                    used_bytes=self.config.firmware_reserved_bytes + plan[c.index] + c.leaked_bytes,
                    total_bytes=self.config.chip_dram_bytes,
                )
                for c in self._chips
            )

    def counters(self) -> tuple[ChipCounters, ...]:
        with self._cv:
            return tuple(
                ChipCounters(chip=c.index, pending=c.pending, finished=c.finished, failed=c.failed) for c in self._chips
            )

    def health(self) -> tuple[ChipHealth, ...]:
        with self._cv:
            return tuple(ChipHealth(chip=c.index, health=c.health, detail=c.fault_detail) for c in self._chips)

    def telemetry(self) -> tuple[ChipTelemetry, ...]:
        """Reset count and queue depth are the mock's own; it models no thermals, power or clocks (null)."""
        with self._cv:
            return tuple(
                telemetry_gaps(
                    ChipTelemetry(chip=c.index, reset_count=c.resets, queue_depth=c.pending),
                    "the mock board models no thermals, power or clocks",
                )
                for c in self._chips
            )

    # -- mock-only ----------------------------------------------------------------------

    def injected_faults(self) -> tuple[InjectedFault, ...]:
        """Every fault that fired so far, in the order it fired."""
        with self._cv:
            return self._faults.log

    def fault_rules(self) -> tuple[FaultRule, ...]:
        """The rules of the board's own fault plan (``--fault-plan``), as configured at open."""
        return tuple(self.config.fault_plan.rules)

    def arm_fault(self, rule: FaultRule) -> int:
        """Add a fault rule now; its ``job``/``unload`` ordinals count from this call. Returns its index."""
        with self._cv:
            return self._faults.add_rule(rule)

    # -- recovery ------------------------------------------------------------------------

    def reset(self, scope: ResetScope | str = ResetScope.CHIP, chip: int | None = None) -> None:
        sc = self._reset_scope(scope)
        with self._cv:
            self._check_open()
            if sc not in self.config.reset_scopes:
                raise NotSupported(
                    f"this board grants no {sc.value} reset (granted: {', '.join(s.value for s in self.config.reset_scopes)})"
                )
            if sc is ResetScope.CHIP:
                index = self._reset_chip(chip, self.config.chips)
                target = self._chips[index]
                if target.fault_scope is ResetScope.BOARD:
                    raise DeviceLost(
                        f"chip {index}: {target.fault_detail}; a chip reset cannot recover it", hint="reset the board"
                    )
                affected = {index}
            else:
                affected = set(range(self.config.chips))
            for d in self._faults.on_reset(chips=sorted(affected)):  # docs/runtime.md §4 reset_failure
                self._faults.record(d, job=None, graph=None, model="", chips=sorted(affected))
                raise DeviceLost(
                    f"{sc.value} reset failed: the device did not come back (injected reset_failure); nothing was reset",
                    hint="reset the board again, or restart the host",
                )
            running = self._abort_chips(affected, f"aborted by {sc.value} reset")
            self._resetting |= affected
            self._cv.notify_all()
        for rec in running:
            rec.done.wait()
        with self._cv:
            self._resetting -= affected  # in the same hold as the clean-up: no submit lands in between
            self._release_quarantined(affected)
            for c in affected:
                ch = self._chips[c]
                ch.health, ch.fault_scope, ch.fault_detail = Health.OK, None, None
                ch.resets += 1
            if sc is ResetScope.BOARD:
                if self._current is not None:
                    self._unload(self._current, inject_leaks=False)
                for ch in self._chips:
                    ch.leaked_bytes = 0  # a device re-init reclaims everything, leaks included
            else:
                self._kv.wipe_chips(affected)
            self._cv.notify_all()

    # -- internals -------------------------------------------------------------------------

    def _check_board_healthy(self, action: str) -> None:
        for ch in self._chips:
            if ch.health is not Health.OK:
                raise DeviceLost(
                    f"cannot {action}: chip {ch.index} is {ch.health.value}: {ch.fault_detail}", hint="reset first"
                )

    def _bind_kv(
        self, plan: GraphPlan, inputs: HostBuffer, lanes: tuple[KvSeqId | None, ...]
    ) -> tuple[list[KvSequence | None], int, int]:
        """Check the job's KV binding against the CSR inputs (000 §9.2). Returns (seqs, tokens, kv_tokens)."""
        batch = inputs.batch
        vocab = self._model_arch_vocab(plan)
        seen: set[KvSeqId] = set()

        def bound(seq: KvSeqId | None, lane: int, tokens_written: int) -> KvSequence:
            if seq is None:
                raise InvalidArgument(f"graph {plan.name!r} lane {lane} is active but kv[{lane}] is None")
            s = self._kv.sequence(seq)
            if s.model != plan.model:
                raise InvalidArgument(
                    f"KV sequence {seq} belongs to model {s.model!r}, graph {plan.name!r} to {plan.model!r}"
                )
            if seq in seen:
                raise InvalidArgument(f"KV sequence {seq} is bound to two lanes of one job")
            seen.add(seq)
            if s.busy_job is not None:
                raise DeviceBusy(f"KV sequence {seq} is being written by job {s.busy_job}", job=s.busy_job)
            if s.reserved - s.committed != tokens_written:
                raise InvalidArgument(
                    f"KV sequence {seq} has {s.reserved - s.committed} reserved tokens, the job writes {tokens_written}; "
                    "kv.append() exactly the tokens the job writes"
                )
            return s

        if plan.kind is GraphKind.PREFILL:
            n = compute.prefill_length(inputs)
            capacity = inputs.layout.slot("tokens").shape[1]
            if not 1 <= n <= capacity:
                raise InvalidArgument(f"graph {plan.name!r}: n_tokens {n} outside 1..{capacity}")
            tokens = inputs.device_view("tokens")[0, :n]
            if tokens.min() < 0 or tokens.max() >= vocab:
                raise InvalidArgument(f"graph {plan.name!r}: token ids outside 0..{vocab - 1}")
            s = bound(lanes[0], 0, n)
            if s.committed != 0:
                raise InvalidArgument(
                    f"prefill writes from position 0 but KV sequence {s.id} has {s.committed} committed tokens"
                )
            return [s], n, 0
        active = compute.decode_lanes(inputs)
        active_lanes = {lane for lane, _, _ in active}
        for lane, seq in enumerate(lanes):
            if lane not in active_lanes and seq is not None:
                raise InvalidArgument(
                    f"graph {plan.name!r} lane {lane} is inactive (lane_valid 0) but kv[{lane}] names sequence {seq}"
                )
        seqs: list[KvSequence | None] = [None] * batch
        kv_tokens = 0
        for lane, token, position in active:
            s = bound(lanes[lane], lane, 1)
            if position != s.committed:
                raise InvalidArgument(
                    f"lane {lane}: position {position} != committed KV length {s.committed} of sequence {s.id} (000 §9.2)"
                )
            if not 0 <= token < vocab:
                raise InvalidArgument(f"lane {lane}: token id {token} outside 0..{vocab - 1}")
            seqs[lane] = s
            kv_tokens += position + 1
        return seqs, len(active), kv_tokens

    def _model_arch_vocab(self, plan: GraphPlan) -> int:
        assert self._current is not None
        return self._current.plan.models[plan.model].model.architecture.vocab_size

    # -- execution ----------------------------------------------------------------------------

    def _startable(self, chip: _Chip) -> _JobRecord | _Hold | None:
        if not chip.queue or chip.health is not Health.OK:
            return None
        head = chip.queue[0]
        if head.bank == "auto":
            return head if not chip.running else None
        return head if "auto" not in chip.running and head.bank not in chip.running else None

    def _worker(self, chip: _Chip) -> None:
        while True:
            with self._cv:
                while True:
                    if self._closed and not chip.queue:
                        return
                    item = self._startable(chip)
                    if item is not None:
                        break
                    self._cv.wait()
                chip.queue.popleft()
                chip.running[item.bank] = item
                if isinstance(item, _Hold):
                    item.acquired.set()
            try:
                if isinstance(item, _Hold):
                    item.rec.done.wait()
                else:
                    self._execute(item)
            finally:
                with self._cv:
                    del chip.running[item.bank]
                    self._cv.notify_all()

    def _execute(self, rec: _JobRecord) -> None:
        for hold in rec.holds:  # MCHIP: every chip of the graph must be ours first
            while not hold.acquired.wait(0.02) and not rec.abort.is_set():
                pass
        serial_held = False
        if self.config.serialize_chips:  # the modelled global runtime lock
            while not rec.abort.is_set() and not (serial_held := self._serial.acquire(timeout=0.02)):
                pass
        try:
            self._run(rec)
        finally:
            if serial_held:
                self._serial.release()

    def _run(self, rec: _JobRecord) -> None:
        with self._cv:
            if rec.abort.is_set() or rec.state.terminal:
                self._finish(rec, JobState.ABORTED, RuntimeStatus.JOB_ABORTED, rec.abort_reason)
                return
            rec.state = JobState.RUNNING
            rec.start_ns = rec.dev_cursor_ns = self._device_start(rec)
            halting = rec.halting.rule.kind if rec.halting else None
            if halting is FaultKind.WAIT_TIMEOUT:
                self._halt(rec, Health.HUNG)
        if halting is FaultKind.WAIT_TIMEOUT:
            rec.abort.wait()  # hangs until a reset (or close) aborts it
            with self._cv:
                self._finish(
                    rec,
                    JobState.ABORTED,
                    RuntimeStatus.JOB_ABORTED,
                    f"hung (injected wait_timeout); {rec.abort_reason}",
                )
            return
        errors: list[str] = []

        def work() -> None:
            if halting is not None:
                return
            try:
                caches = [s.cache if s is not None else None for s in rec.seqs]
                assert rec.model is not None  # set until the job finishes
                compute.run_graph(rec.model, rec.plan.kind, rec.inputs, rec.outputs, caches)
                self._corrupt(rec)
            except Exception as exc:  # a mock bug must fail the job, not kill the chip thread
                errors.append(f"mock compute failed: {type(exc).__name__}: {exc}")

        units = self._chips[rec.job.chips[0]].units
        aborted, debt = False, 0.0
        for phase, seconds, fn in (
            (JobPhase.H2D, rec.phases.h2d_s, None),
            (JobPhase.COMPUTE, rec.phases.compute_s, work),
            (JobPhase.D2H, rec.phases.d2h_s, None),
        ):
            aborted, debt = self._phase(rec, units[phase], phase, seconds, fn, debt)
            if aborted:
                break
        error = errors[0] if errors else None
        with self._cv:
            if aborted:
                self._finish(rec, JobState.ABORTED, RuntimeStatus.JOB_ABORTED, rec.abort_reason)
            elif halting is FaultKind.CCU_EXCEPTION:
                self._finish(
                    rec, JobState.FAILED, RuntimeStatus.CCU_EXCEPTION, "CalCore exception (injected ccu_exception)"
                )
                self._halt(rec, Health.FAULTED)
            elif halting is FaultKind.UNKNOWN_DMA_STATE:
                self._finish(
                    rec,
                    JobState.FAILED,
                    RuntimeStatus.UNKNOWN_DMA_STATE,
                    "DMA state unknown (injected unknown_dma_state); buffers held until a reset",
                    quarantine=True,
                )
                self._halt(rec, Health.FAULTED)
            elif error is not None:
                self._finish(rec, JobState.FAILED, RuntimeStatus.INTERNAL, error)
            else:
                self._finish(rec, JobState.SUCCEEDED, RuntimeStatus.OK, None)

    def _phase(
        self,
        rec: _JobRecord,
        unit: threading.Lock,
        phase: JobPhase,
        seconds: float,
        work: Callable[[], None] | None,
        debt: float,
    ) -> tuple[bool, float]:
        """Run one phase on the chip's unit for it: wait for the unit, do ``work``, sleep the rest.

        Returns (aborted, debt): ``debt`` is how far the numpy work overran its phase, taken off the
        next phase's sleep so a job alone on its chip still takes max(model time, real compute), as
        before phases existed. A phase of zero seconds with no work is skipped (not traced). The unit
        is taken and given back per phase, so a job waiting for the compute unit holds no channel.
        """
        if seconds <= 0 and work is None:
            return rec.abort.is_set(), debt
        while not unit.acquire(timeout=0.02):
            if rec.abort.is_set():
                return True, debt
        try:
            chip = self._chips[rec.job.chips[0]]
            with self._cv:
                dev_start = max(rec.dev_cursor_ns, chip.unit_free_ns[phase])
            t0 = time.perf_counter()
            if work is not None:
                work()
            remaining = seconds - debt - (time.perf_counter() - t0)
            aborted = rec.abort.wait(remaining) if remaining > 0 else rec.abort.is_set()
            dev_end = dev_start + round(seconds * 1e9)
            if aborted:  # cut short by a reset: it ended when the abort came, on the device too
                dev_end = max(dev_start, min(dev_end, time.monotonic_ns()))
            with self._cv:
                chip.unit_free_ns[phase] = max(chip.unit_free_ns[phase], dev_end)
                rec.dev_cursor_ns = dev_end
            rec.phase_log.append(PhaseInterval(phase, dev_start, dev_end))
            return aborted, max(0.0, -remaining)
        finally:
            unit.release()

    def _device_start(self, rec: _JobRecord) -> int:
        """When ``rec`` starts on the device timeline (under ``_cv``): submitted, and its bank free on every chip.

        An ``auto`` job waits for the chip's last job of any bank; a ``ping``/``pong`` job for its own bank's
        and any ``auto`` job's; under ``serialize_chips`` also for the board lock's last holder.
        """
        start = rec.job.submit_ns
        for c in rec.job.chips:
            free = self._chips[c].bank_free_ns
            start = max(start, max(free.values()) if rec.bank == "auto" else max(free[rec.bank], free["auto"]))
        if self.config.serialize_chips:
            start = max(start, self._serial_free_ns)
        return start

    def _corrupt(self, rec: _JobRecord) -> None:
        for d in rec.corruptions:
            rng = d.rng()
            if d.rule.kind is FaultKind.CORRUPT_OUTPUT:
                logits = rec.outputs.device_view("logits")
                scale = max(float(np.std(logits)), 1e-3) * d.rule.magnitude
                logits += (rng.standard_normal(logits.shape) * scale).astype(np.float32)
            else:  # KV corruption: perturb what this job wrote into its sequences' caches
                for s in rec.seqs:
                    if s is None:
                        continue
                    end = s.reserved
                    for arr in (s.cache.k, s.cache.v):
                        block = arr[:, :end]
                        scale = max(float(np.std(block)), 1e-3) * d.rule.magnitude
                        block += (rng.standard_normal(block.shape) * scale).astype(np.float32)

    def _halt(self, rec: _JobRecord, health: Health) -> None:
        """Apply a halting fault: the job's chips (or the whole board) stop until a reset."""
        assert rec.halting is not None
        rule = rec.halting.rule
        chips = set(range(self.config.chips)) if rule.reset_scope is ResetScope.BOARD else set(rec.job.chips)
        detail = f"{rule.kind.value} in job {rec.job.id} ({rec.job.graph}); needs a {rule.reset_scope.value} reset"
        for c in sorted(chips):
            ch = self._chips[c]
            ch.health = health if ch.health is Health.OK else ch.health
            if ch.fault_scope is not ResetScope.BOARD:
                ch.fault_scope = rule.reset_scope
            ch.fault_detail = ch.fault_detail or detail
        if health is Health.FAULTED:
            self._abort_queued(chips, f"aborted: chip halted by {detail}")
        self._cv.notify_all()

    def _abort_queued(self, chips: set[int], reason: str) -> None:
        victims: list[_JobRecord] = []
        for c in chips:
            for item in list(self._chips[c].queue):
                rec = _item_record(item)
                if rec not in victims:
                    victims.append(rec)
        for rec in victims:
            for ch in self._chips:
                for item in list(ch.queue):
                    if _item_record(item) is rec:
                        ch.queue.remove(item)
            if self._is_executing(rec):
                # An MCHIP job whose primary already started waits for a hold here: its thread finishes it.
                rec.abort_reason = reason
                rec.abort.set()
            else:
                self._finish(rec, JobState.ABORTED, RuntimeStatus.JOB_ABORTED, reason)

    def _is_executing(self, rec: _JobRecord) -> bool:
        return any(ch.running.get(rec.bank) is rec for ch in self._chips)

    def _abort_chips(self, chips: set[int], reason: str) -> list[_JobRecord]:
        """Abort queued jobs now and signal running ones; return the running ones to wait for."""
        self._abort_queued(chips, reason)
        victims: list[_JobRecord] = []
        for c in chips:
            for item in self._chips[c].running.values():
                rec = _item_record(item)
                if rec not in victims and not rec.state.terminal:
                    victims.append(rec)
        for rec in self._jobs.values():  # MCHIP primaries already signalled by _abort_queued
            if not rec.state.terminal and rec.abort.is_set() and rec not in victims:
                victims.append(rec)
        running: list[_JobRecord] = []
        for rec in victims:
            rec.abort_reason = reason
            rec.abort.set()
            if self._is_executing(rec):
                running.append(rec)  # its executor thread finishes it
                continue
            # An MCHIP job holding this chip while its primary still queues elsewhere: finish it here.
            for ch in self._chips:
                for item in list(ch.queue):
                    if _item_record(item) is rec:
                        ch.queue.remove(item)
            self._finish(rec, JobState.ABORTED, RuntimeStatus.JOB_ABORTED, reason)
        return running

    def _finish(
        self, rec: _JobRecord, state: JobState, status: RuntimeStatus, detail: str | None, *, quarantine: bool = False
    ) -> None:
        """Terminal transition, exactly once, under the board lock."""
        if rec.state.terminal:
            return
        rec.state, rec.status, rec.detail = state, status, detail
        if rec.start_ns is not None:
            # Device timeline: the end of its last phase; a job that ran no phase (a hang, an abort before
            # its first unit) ended when the host ended it.
            rec.end_ns = rec.dev_cursor_ns if rec.phase_log else max(rec.start_ns, time.monotonic_ns())
            for c in rec.job.chips:
                free = self._chips[c].bank_free_ns
                free[rec.bank] = max(free.get(rec.bank, 0), rec.end_ns)
            if self.config.serialize_chips:
                self._serial_free_ns = max(self._serial_free_ns, rec.end_ns)
        result = rec.result()
        for c in rec.job.chips:
            ch = self._chips[c]
            ch.pending -= 1
            if state is JobState.SUCCEEDED:
                ch.finished += 1
            else:
                ch.failed += 1
        self._trace_job(rec.job, result, phases=tuple(rec.phase_log))
        self._settle(rec, quarantine=quarantine)
        for s in rec.seqs:
            if s is not None and s.busy_job == rec.job.id:
                s.busy_job = None
                s.last_job_failed = state is not JobState.SUCCEEDED
        # A finished job keeps no KV and no weights (a quarantined one keeps its buffers until a reset).
        rec.seqs, rec.model, rec.corruptions = [], None, []
        rec.done.set()
        self._jobs.pop(rec.job.id, None)
        self._finished[rec.job.id] = result
        while len(self._finished) > self.config.history:
            self._finished.popitem(last=False)
        self._cv.notify_all()


def _touched(n: int) -> bytearray:
    """``n`` bytes of host memory with every page written, so they are resident (an injected host leak)."""
    buf = bytearray(n)
    for i in range(0, n, 4096):
        buf[i] = 1
    return buf


def open_mock(**options: object) -> MockRuntime:
    """Open the mock board with :class:`MockBoardConfig` options (``fault_plan`` may be a path)."""
    plan = options.get("fault_plan")
    if plan is not None and not isinstance(plan, FaultPlan):
        options["fault_plan"] = FaultPlan.load(Path(str(plan)))
    elif plan is None:
        options.pop("fault_plan", None)
    try:
        config = MockBoardConfig(**options)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(f"mock board: {exc}") from None
    return MockRuntime(config)


__all__ = ["MockBoardConfig", "MockRuntime", "open_mock"]
