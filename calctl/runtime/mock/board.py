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
* time: each job's phases last their :class:`TimingModel` seconds x
  ``time_scale``; the thread simulating it sleeps until each phase's end on
  the device timeline below (the numpy compute counts towards its phase; the
  sleep releases the GIL), so a thread the host ran late catches up rather
  than adding its delay to the phases and jobs after it;
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
* a per-chip trace of job intervals and per-chip counters;
* per-chip telemetry (``thermal.py``): temperature and power rising with the compute on the device clock,
  throttling above the limit (compute slows), ECC counters; faults ``fan_failed``, ``stuck_sensor``,
  ``ecc_errors``.

Recovery: ``reset("chip", chip=c)`` aborts chip c's jobs, empties its models'
KV sequences and clears its fault, keeping the configuration; a fault whose
scope is ``board`` refuses a chip reset (DeviceLost). ``reset("board")`` aborts
everything, drops the configuration and reclaims every byte, leaks included.
The mock grants both scopes by default; ``reset_scopes=("board",)`` models a
runtime with only a board reset.

Mock results are mock results: nothing here is evidence about a board (docs/runtime.md §5).
This module is the board's Runtime API (open, configure, submit, wait, observe, reset); the chips at
work are :mod:`.execution`, the per-job and per-chip records :mod:`.state`, the KV store and a job's
KV binding :mod:`.kv`, the board's shape :mod:`.config`. It does not parse packages
(``calctl.package``) or fault-plan YAML.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from calctl.errors import ConfigError
from calctl.package.model import Package
from calctl.runtime.buffers import Direction, HostBuffer, buffer_layout
from calctl.runtime.calbin import Calbin, plan_calbin
from calctl.runtime.errors import (
    AlreadyConfigured,
    DeviceBusy,
    DeviceInUse,
    DeviceLost,
    NotConfigured,
    NotSupported,
    OutOfMemory,
)
from calctl.runtime.memory import MemTransfer, TransferDirection
from calctl.runtime.mock import compute
from calctl.runtime.mock.config import MockBoardConfig
from calctl.runtime.mock.execution import ChipExecution
from calctl.runtime.mock.faults import FaultDecision, FaultInjector, FaultKind, FaultPlan, FaultRule, InjectedFault
from calctl.runtime.mock.kv import MockKvManager
from calctl.runtime.mock.memory import WINDOW_BYTES, MockDeviceMemory
from calctl.runtime.mock.state import ChipHold, MockJob
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
    JobResult,
    KvSeqId,
    ResetScope,
    Topology,
    Versions,
)

# One physical device per process (001 §2.1: VirtualDevice "temporary only support one physical device").
_PROCESS_LOCK = threading.Lock()
_PROCESS_DEVICE: MockRuntime | None = None


def _free_process_device(device: MockRuntime) -> None:
    """The process may open a mock board again: ``device`` closed, or its setup did not finish."""
    global _PROCESS_DEVICE
    with _PROCESS_LOCK:
        if _PROCESS_DEVICE is device:
            _PROCESS_DEVICE = None


class MockRuntime(ChipExecution):
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
        with contextlib.ExitStack() as failed:  # a setup that did not finish leaves the process's device free
            failed.callback(_free_process_device, self)
            self._setup()
            failed.pop_all()

    def _setup(self) -> None:
        lock = threading.RLock()
        self._cv = threading.Condition(lock)
        self._init_bookkeeping(self._cv, self.config.history, self.config.history_bytes)
        # Chips a reset is under way on: it waits for their running jobs with the lock released, and a job
        # submitted to them meanwhile would survive the reset (and run on what it cleared), so submit refuses.
        self._resetting: set[int] = set()
        self._kv = MockKvManager(self._cv)
        self._faults = FaultInjector(self.config.fault_plan, self.config.seed)
        self._job_ids = itertools.count(1)
        self._host_leaks: list[bytearray] = []  # host_memory_leak faults: kept for the life of the board
        cfg = self.config
        self._memory = MockDeviceMemory(
            chips=cfg.chips,
            base=cfg.firmware_reserved_bytes,
            window=min(WINDOW_BYTES, cfg.chip_dram_bytes - cfg.firmware_reserved_bytes),
            model=cfg.transfer,
            lock=lock,
            faults=self._faults,
        )
        self._start_chips(lock)

    # -- device ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            running = self._abort_chips(set(range(self.config.chips)), "aborted: the device was closed")
            self._wake()
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
        _free_process_device(self)

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
            assert self._current is not None  # _submit_plan found the graph in it
            vocab = self._current.plan.models[plan.model].model.architecture.vocab_size
            seqs, tokens, kv_tokens = self._kv.bind(plan, inputs, lanes, vocab)
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
            corruptions = [d for d in decisions if d.rule.kind.corrupts]
            for d in decisions:
                if d.rule.kind.on_telemetry:
                    self._telemetry_fault(d, plan.chips)
                    self._faults.record(d, job=None, graph=plan.name, model=plan.model, chips=plan.chips)

            job = self._job(
                next(self._job_ids), plan, inputs, eng, lanes, generation=generation, submit_ns=time.monotonic_ns()
            )
            job_id = job.id
            for d in ([halting] if halting else []) + corruptions:
                self._faults.record(d, job=job_id, graph=plan.name, model=plan.model, chips=plan.chips)
            split = self.config.timing.phases(plan.name, plan.kind, plan.chips[0], tokens=tokens, kv_tokens=kv_tokens)
            bank = "auto" if len(plan.chips) > 1 or eng is Engine.AUTO else eng.value
            model = self._calbins[self._current.id][1][plan.model] if self._current else None
            assert model is not None
            rec = MockJob(
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
                hold = ChipHold(rec, c)
                rec.holds.append(hold)
                self._chips[c].queue.append(hold)
            for c in plan.chips:
                self._chips[c].pending += 1
            self._jobs[job_id] = rec
            self._wake_one(plan.chips)  # one thread of each chip it targets
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
        if len(records) == 1:  # the engine's case: wait on the job's own event, woken by its end alone
            rec = records[0]
            if isinstance(rec, MockJob) and not rec.done.is_set():
                rec.done.wait(max(0.0, timeout))
            return [rec.job] if rec.state.terminal else []
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

    def _record(self, job: Job) -> MockJob | JobResult:
        with self._cv:
            rec: MockJob | JobResult | None = self._jobs.get(job.id) or self._finished.get(job.id)
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
        """Every field: the thermal model's reading on the device clock (:mod:`.thermal`), the chip's resets and
        queue. Mock numbers, never a board's (docs/runtime.md §9)."""
        now = time.monotonic_ns()
        with self._cv:
            out = []
            for c in self._chips:
                r = self._thermal[c.index].reading(now)
                out.append(
                    ChipTelemetry(
                        chip=c.index,
                        temperature_c=float(r["temperature_c"]),
                        power_w=float(r["power_w"]),
                        frequency_mhz=float(r["frequency_mhz"]),
                        throttled=bool(r["throttled"]),
                        reset_count=c.resets,
                        queue_depth=c.pending,
                        temperature_limit_c=float(r["temperature_limit_c"]),
                        power_limit_w=float(r["power_limit_w"]),
                        frequency_max_mhz=float(r["frequency_max_mhz"]),
                        throttle_reasons=("thermal",) if r["throttled"] else (),
                        throttled_s=float(r["throttled_s"]),
                        ecc_correctable=int(r["ecc_correctable"]),
                        ecc_uncorrectable=int(r["ecc_uncorrectable"]),
                        sample_ns=now,
                    )
                )
            return tuple(out)

    def _telemetry_fault(self, d: FaultDecision, chips: Iterable[int]) -> None:
        """Apply a telemetry fault (fan_failed, stuck_sensor, ecc_errors) to the rule's chip, else the job's."""
        now = time.monotonic_ns()
        for c in [d.rule.chip] if d.rule.chip is not None else chips:
            th = self._thermal[c]
            if d.rule.kind is FaultKind.FAN_FAILED:
                th.fan_factor = d.rule.magnitude
            elif d.rule.kind is FaultKind.STUCK_SENSOR:
                if th.stuck_c is None:
                    th.stuck_c = float(th.reading(now)["temperature_c"])
            elif d.rule.ecc == "uncorrectable":
                th.ecc_uncorrectable += d.rule.count
            else:
                th.ecc_correctable += d.rule.count

    # -- device memory (calctl.runtime.memory.DeviceMemory; docs/runtime.md §8) ------------------

    def test_window(self, chip: int) -> tuple[int, int]:
        return self._memory.test_window(chip)

    def write_mem(self, chip: int, address: int, data: np.ndarray) -> MemTransfer:
        return self._mem_transfer(chip, address, data, TransferDirection.H2D)

    def read_mem(self, chip: int, address: int, out: np.ndarray) -> MemTransfer:
        return self._mem_transfer(chip, address, out, TransferDirection.D2H)

    def _mem_transfer(self, chip: int, address: int, buf: np.ndarray, direction: TransferDirection) -> MemTransfer:
        self._memory.test_window(chip)  # InvalidArgument for a chip the board does not have
        with self._cv:
            self._check_open()
            self._memory.refuse_while_configured(self._current is not None)
            health = self._chips[chip].health
        return self._memory.transfer(chip, address, buf, direction, health)

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
            decisions = self._faults.on_reset(chips=sorted(affected), scope=sc)  # docs/runtime.md §4 reset faults
            for d in decisions:
                self._faults.record(d, job=None, graph=None, model="", chips=sorted(affected))
            if any(d.rule.kind is FaultKind.RESET_FAILURE for d in decisions):
                raise DeviceLost(
                    f"{sc.value} reset failed: the device did not come back (injected reset_failure); nothing was reset",
                    hint="reset the board again, or restart the host",
                )
            running = self._abort_chips(affected, f"aborted by {sc.value} reset")
            self._resetting |= affected
            self._wake()
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
            self._after_reset_faults(sc, affected, decisions)
            self._wake()
            self._cv.notify_all()

    def _after_reset_faults(self, sc: ResetScope, affected: set[int], decisions: list[FaultDecision]) -> None:
        """The reset returned OK, and yet a chip is down (docs/runtime.md §4): ``reset_chip_lost`` leaves a chip
        it reset halted (a board reset is what it needs); ``reset_takes_other_chip`` halts the chips the chip
        reset did not touch, aborting their jobs. Called under the board lock, after the clean-up."""
        for d in decisions:
            if d.rule.kind is FaultKind.RESET_CHIP_LOST:
                down = {d.rule.chip} if d.rule.chip is not None else affected
                detail = f"did not come back after the {sc.value} reset (injected reset_chip_lost)"
                scope = ResetScope.BOARD
            elif d.rule.kind is FaultKind.RESET_TAKES_OTHER_CHIP:
                down = set(range(self.config.chips)) - affected
                detail = (
                    f"went down with the chip {', '.join(map(str, sorted(affected)))} reset "
                    "(injected reset_takes_other_chip)"
                )
                scope = ResetScope.CHIP
            else:
                continue
            self._abort_chips(down, f"aborted: chip {detail}")  # their threads finish the running ones
            for c in sorted(down):
                ch = self._chips[c]
                ch.health, ch.fault_scope, ch.fault_detail = Health.FAULTED, scope, detail

    # -- internals -------------------------------------------------------------------------

    def _check_board_healthy(self, action: str) -> None:
        for ch in self._chips:
            if ch.health is not Health.OK:
                raise DeviceLost(
                    f"cannot {action}: chip {ch.index} is {ch.health.value}: {ch.fault_detail}", hint="reset first"
                )


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


__all__ = ["MockRuntime", "open_mock"]
