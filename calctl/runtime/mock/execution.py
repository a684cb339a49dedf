"""The mock board's chips at work: queues, executor threads, job phases on the device timeline, faults applied.

:class:`ChipExecution` is the part of :class:`calctl.runtime.mock.MockRuntime` that runs jobs (see
:mod:`.board` for what the board simulates). Every chip has a FIFO queue and two executor threads, one per
ping/pong bank: an ``auto`` job runs alone on its chip, a ``ping`` and a ``pong`` job may be in flight together
but share the chip's one unit per phase (h2d, compute, d2h), so their computes never overlap (001 §9.3,
000 §14). An MCHIP job holds every chip of its graph; ``serialize_chips`` adds the modelled global runtime lock.
Job and phase times are stamps on a simulated per-chip timeline, never the host's wall clock (docs/runtime.md
"Job timestamps"). A halting fault stops the job's chips (or the board) until a reset; every job ends in
exactly one terminal transition (:meth:`ChipExecution._finish`), which counts it, traces it and gives its
buffers back.

This module does not accept jobs (``submit`` checks and queues them), decide faults (``faults.py``) or reset
chips; it runs what is queued, under the board's lock ``_cv``.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np

from calctl.package.model import GraphKind
from calctl.runtime.bookkeeping import DeviceBookkeeping
from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.mock import compute
from calctl.runtime.mock.config import MockBoardConfig
from calctl.runtime.mock.faults import FaultKind
from calctl.runtime.mock.state import ChipHold, ChipState, MockJob, job_of
from calctl.runtime.mock.thermal import ChipThermal
from calctl.runtime.types import Health, JobId, JobPhase, JobResult, JobState, PhaseInterval, ResetScope

#: prctl(2) PR_SET_TIMERSLACK, and the slack the chip threads ask for: 1 µs instead of Linux's default 50 µs.
_PR_SET_TIMERSLACK = 29
_TIMER_SLACK_NS = 1000


def _precise_sleeps() -> None:
    """Ask the kernel for 1 µs timer slack on this thread (Linux). With the default 50 µs every timed sleep ends
    up to 50 µs late, so each simulated job ended tens of microseconds after its device end before its waiter
    heard of it; a real board's completion does not wait for a timer. Nothing elsewhere, or if prctl fails."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, _TIMER_SLACK_NS, 0, 0, 0)


class ChipExecution(DeviceBookkeeping[MockJob, dict[str, compute.LoadedModel]]):
    """The board's chips and the threads that run their jobs; the base of ``MockRuntime``."""

    config: MockBoardConfig
    # The board lock: every chip, queue and job record is guarded by it. Waiting on ``_cv`` itself is for
    # ``wait_any`` over several jobs (a job's end notifies it); a chip's executor threads wait on their chip's
    # own condition over the same lock (``ChipState.cv``), so a submit or a job's end wakes one chip's
    # threads, not every thread of the board.
    _cv: threading.Condition

    def _start_chips(self, lock: threading.RLock) -> None:
        """Make the chips (each with its condition over the board ``lock``) and their timeline, then start two
        executor threads per chip."""
        self._serial = threading.Lock()
        self._serial_free_ns = 0  # device timeline of the modelled global lock
        self._chips = [ChipState(i, threading.Condition(lock)) for i in range(self.config.chips)]
        self._thermal = [ChipThermal(self.config.thermal, time.monotonic_ns()) for _ in self._chips]
        # Jobs in flight (queued or running). A finished job leaves it: only its JobResult is kept, in
        # _finished, for wait/query, as long as the bounded history keeps its trace events (count and bytes,
        # calctl.runtime.history); no buffer, KV sequence or weights stay reachable from a finished job.
        self._jobs: dict[JobId, MockJob] = {}
        self._finished: OrderedDict[JobId, JobResult] = OrderedDict()
        self._threads = [
            threading.Thread(target=self._worker, args=(chip,), name=f"mock-chip{chip.index}-bank{b}", daemon=True)
            for chip in self._chips
            for b in range(2)
        ]
        for t in self._threads:
            t.start()

    def _forget(self, job: JobId) -> None:
        self._finished.pop(job, None)

    def _wake(self, chips: Iterable[int] | None = None) -> None:
        """Wake the executor threads of ``chips`` (None: every chip), under the board lock: something they wait
        for changed (a queue emptied, health restored, the board closing)."""
        for ch in self._chips if chips is None else (self._chips[c] for c in chips):
            ch.cv.notify_all()

    def _wake_one(self, chips: Iterable[int]) -> None:
        """One item joined each of ``chips``' queues: wake one executor thread of each (the two are alike, and a
        thread decides under the board lock before it waits, so a wake-up is never lost; a thread that finds
        the item not startable yet is woken again when the chip's running job ends). Waking both would wake
        one for nothing: a futex call and a thread switch per job."""
        for c in chips:
            self._chips[c].cv.notify()

    def _startable(self, chip: ChipState) -> MockJob | ChipHold | None:
        if not chip.queue or chip.health is not Health.OK:
            return None
        head = chip.queue[0]
        if head.bank == "auto":
            return head if not chip.running else None
        return head if "auto" not in chip.running and head.bank not in chip.running else None

    def _worker(self, chip: ChipState) -> None:
        _precise_sleeps()
        while True:
            with self._cv:
                while True:
                    if self._closed and not chip.queue:
                        return
                    item = self._startable(chip)
                    if item is not None:
                        break
                    chip.cv.wait()
                chip.queue.popleft()
                chip.running[item.bank] = item
                if isinstance(item, ChipHold):
                    item.acquired.set()
            try:
                if isinstance(item, ChipHold):
                    item.rec.done.wait()
                else:
                    self._execute(item)
            finally:
                with self._cv:
                    del chip.running[item.bank]
                    if chip.queue:  # the chip's other thread may start the head now (this one takes the next)
                        chip.cv.notify()

    def _execute(self, rec: MockJob) -> None:
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

    def _run(self, rec: MockJob) -> None:
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
                unwritten = any(d.rule.kind is FaultKind.UNWRITTEN_LOGITS for d in rec.corruptions)
                held = rec.outputs.device_view("logits").copy() if unwritten else None
                compute.run_graph(rec.model, rec.plan.kind, rec.inputs, rec.outputs, caches)
                if held is not None:  # injected unwritten_logits: done, but the output DMA never happened
                    rec.outputs.device_view("logits")[...] = held
                self._corrupt(rec)
            except Exception as exc:  # a mock bug must fail the job, not kill the chip thread
                errors.append(f"mock compute failed: {type(exc).__name__}: {exc}")

        units = self._chips[rec.job.chips[0]].units
        aborted = False
        for phase, seconds, fn in (
            (JobPhase.H2D, rec.phases.h2d_s, None),
            (JobPhase.COMPUTE, rec.phases.compute_s, work),
            (JobPhase.D2H, rec.phases.d2h_s, None),
        ):
            aborted = self._phase(rec, units[phase], phase, seconds, fn)
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
        rec: MockJob,
        unit: threading.Lock,
        phase: JobPhase,
        seconds: float,
        work: Callable[[], None] | None,
    ) -> bool:
        """Run one phase on the chip's unit for it: wait for the unit, do ``work``, sleep until the phase's end.

        Returns whether the job was aborted. The sleep lasts until the phase's end on the device timeline
        (CLOCK_MONOTONIC, the host's clock too), not for its modelled seconds: a thread the host ran late (its
        wake-up after the previous phase, the numpy work overrunning the phase) catches up instead of adding
        its delay to every later phase and job, and a job alone on its chip still takes max(model time, real
        compute). A phase of zero seconds with no work is skipped (not traced). The unit is taken and given
        back per phase, so a job waiting for the compute unit holds no channel.
        """
        if seconds <= 0 and work is None:
            return rec.abort.is_set()
        while not unit.acquire(timeout=0.02):
            if rec.abort.is_set():
                return True
        try:
            chip = self._chips[rec.job.chips[0]]
            thermal = self._thermal[chip.index] if phase is JobPhase.COMPUTE else None
            with self._cv:
                dev_start = max(rec.dev_cursor_ns, chip.unit_free_ns[phase])
                if thermal is not None:  # a throttled chip computes at its lowered clock (thermal.py)
                    seconds /= thermal.clock_factor
                    thermal.begin(dev_start)
            dev_end = dev_start + round(seconds * 1e9)
            if work is not None:
                work()
            remaining = (dev_end - time.monotonic_ns()) / 1e9
            aborted = rec.abort.wait(remaining) if remaining > 0 else rec.abort.is_set()
            if aborted:  # cut short by a reset: it ended when the abort came, on the device too
                dev_end = max(dev_start, min(dev_end, time.monotonic_ns()))
            with self._cv:
                chip.unit_free_ns[phase] = max(chip.unit_free_ns[phase], dev_end)
                rec.dev_cursor_ns = dev_end
                if thermal is not None:  # the work heats the chip on the device clock
                    thermal.work(dev_start, dev_end)
            rec.phase_log.append(PhaseInterval(phase, dev_start, dev_end))
            return aborted
        finally:
            unit.release()

    def _device_start(self, rec: MockJob) -> int:
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

    def _corrupt(self, rec: MockJob) -> None:
        for d in rec.corruptions:
            rng = d.rng()
            if d.rule.kind is FaultKind.CORRUPT_OUTPUT:
                logits = rec.outputs.device_view("logits")
                scale = max(float(np.std(logits)), 1e-3) * d.rule.magnitude
                logits += (rng.standard_normal(logits.shape) * scale).astype(np.float32)
            elif d.rule.kind is FaultKind.INACTIVE_LANE_KV:
                self._inactive_lanes_write_kv(rec, rng, d.rule.magnitude)
            elif d.rule.kind is FaultKind.UNWRITTEN_LOGITS:
                continue  # applied around the compute (``work``)
            else:  # KV corruption: perturb what this job wrote into its sequences' caches
                for s in rec.seqs:
                    if s is None:
                        continue
                    end = s.reserved
                    for arr in (s.cache.k, s.cache.v):
                        block = arr[:, :end]
                        scale = max(float(np.std(block)), 1e-3) * d.rule.magnitude
                        block += (rng.standard_normal(block.shape) * scale).astype(np.float32)

    @staticmethod
    def _inactive_lanes_write_kv(rec: MockJob, rng: np.random.Generator, magnitude: float) -> None:
        """The broken shim of ``inactive_lane_kv``, as one ships it: an inactive lane (``lane_valid`` 0) runs
        anyway, on the sequence its lane slot still maps to (the nearest active lane before it: the slot table
        the shim filled for the lanes it did run), and writes its K/V row at the position the lane carries
        (whatever the caller padded it with: lane 0's position for the serving engine, 0 for the runners).

        The row it writes is the pad token's K/V at that position, which differs from what the sequence holds
        there (noise of ``magnitude`` × std here), except where a real write would change nothing: a row the
        sequence has not written yet (it writes its own there later) or the very row its own lane writes in this
        job with the same token (the engine's padding of a one-lane batch)."""
        if rec.plan.kind is not GraphKind.DECODE:
            return
        active = {lane: (token, position) for lane, token, position in compute.decode_lanes(rec.inputs)}
        tokens, positions = rec.inputs.device_view("tokens"), rec.inputs.device_view("positions")
        owner = None  # the nearest active lane before the current one
        for lane in range(rec.inputs.batch):
            if lane in active:
                owner = lane
                continue
            victim = rec.seqs[owner] if owner is not None else None
            if owner is None or victim is None:
                continue
            row, token = int(positions[lane]), int(tokens[lane, 0])
            if not 0 <= row < victim.reserved or (token, row) == active[owner]:
                continue
            for arr in (victim.cache.k, victim.cache.v):
                block = arr[:, row]
                scale = max(float(np.std(block)), 1e-3) * magnitude
                block += (rng.standard_normal(block.shape) * scale).astype(np.float32)

    def _halt(self, rec: MockJob, health: Health) -> None:
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
        self._wake()
        self._cv.notify_all()

    def _abort_queued(self, chips: set[int], reason: str) -> None:
        victims: list[MockJob] = []
        for c in chips:
            for item in list(self._chips[c].queue):
                rec = job_of(item)
                if rec not in victims:
                    victims.append(rec)
        for rec in victims:
            for ch in self._chips:
                for item in list(ch.queue):
                    if job_of(item) is rec:
                        ch.queue.remove(item)
                        ch.cv.notify_all()  # a new head of its queue
            if self._is_executing(rec):
                # An MCHIP job whose primary already started waits for a hold here: its thread finishes it.
                rec.abort_reason = reason
                rec.abort.set()
            else:
                self._finish(rec, JobState.ABORTED, RuntimeStatus.JOB_ABORTED, reason)

    def _is_executing(self, rec: MockJob) -> bool:
        return any(ch.running.get(rec.bank) is rec for ch in self._chips)

    def _abort_chips(self, chips: set[int], reason: str) -> list[MockJob]:
        """Abort queued jobs now and signal running ones; return the running ones to wait for."""
        self._abort_queued(chips, reason)
        victims: list[MockJob] = []
        for c in chips:
            for item in self._chips[c].running.values():
                rec = job_of(item)
                if rec not in victims and not rec.state.terminal:
                    victims.append(rec)
        for rec in self._jobs.values():  # MCHIP primaries already signalled by _abort_queued
            if not rec.state.terminal and rec.abort.is_set() and rec not in victims:
                victims.append(rec)
        running: list[MockJob] = []
        for rec in victims:
            rec.abort_reason = reason
            rec.abort.set()
            if self._is_executing(rec):
                running.append(rec)  # its executor thread finishes it
                continue
            # An MCHIP job holding this chip while its primary still queues elsewhere: finish it here.
            for ch in self._chips:
                for item in list(ch.queue):
                    if job_of(item) is rec:
                        ch.queue.remove(item)
                        ch.cv.notify_all()
            self._finish(rec, JobState.ABORTED, RuntimeStatus.JOB_ABORTED, reason)
        return running

    def _finish(
        self, rec: MockJob, state: JobState, status: RuntimeStatus, detail: str | None, *, quarantine: bool = False
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
        self._finished[rec.job.id] = result  # before the trace: the history may let it go at once
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
        # wait_any over several jobs waits on the board condition; one job's waiter waits on ``done`` itself.
        # The chips' threads need no wake here: the thread that ran the job frees its bank and wakes its chip.
        self._cv.notify_all()
