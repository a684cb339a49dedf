"""DeviceExecutor: one alias's side of the board (001 §10.2, §10.3, §11.3; 000 §9.2, §14).

The executor owns what touches the runtime for one alias:

* the runtime handle of the generation being served (attached at publish, detached at unload);
* the map from the scheduler's KV lanes to runtime KV sequences;
* the host buffers of every job in flight, exclusively the job's from submit to completion;
* submit, with the bounded DeviceBusy backoff of 001 §11.3;
* the quarantine: a timed-out or retired job keeps its buffers until the runtime gives them back;
* the ping/pong banks (:class:`~calctl.serving.engine.modes.BankSlots`);
* the completion threads of the ``async`` and ``pingpong`` modes, which wait for one job each and
  **only post** "job done" / "job timed out" to the engine core's inbox.

Every method except the completion threads' loop runs on the engine core's thread
(:class:`~calctl.serving.engine.loop.EngineCore`), so nothing here takes a lock. It does not
sample, does not know requests and never calls the scheduler: it answers with
:class:`~calctl.serving.core.scheduler.JobOutcome` values and the logits of a finished job.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calctl.package.model import Model
from calctl.runtime.buffers import BufferState, HostBuffer
from calctl.runtime.errors import DeviceBusy, RuntimeLayerError, RuntimeStatus
from calctl.runtime.interface import Runtime
from calctl.runtime.types import Engine as JobEngine
from calctl.runtime.types import GenerationId as RtGenerationId
from calctl.runtime.types import Health, JobResult, KvSeqId
from calctl.runtime.types import Job as RtJob
from calctl.serving.core.ids import JobId, LaneId, RequestId
from calctl.serving.core.scheduler import DecodeJob, JobOutcome, JobStatus, PrefillJob
from calctl.serving.engine.end_window import EndWindows, Window, job_shape
from calctl.serving.engine.job_checks import logits_fault, status_anomaly
from calctl.serving.engine.metrics import EngineMetrics
from calctl.serving.engine.modes import BankSlots, SlotConflict
from calctl.serving.engine.monitor import Downgrade, ExecutorMonitor
from calctl.serving.engine.options import Clock
from calctl.serving.record_sink import job_phases, ms

log = logging.getLogger("calctl.serve")

#: 001 §11.3 "DeviceBusy -> bounded backoff": at most this many retries, doubling from 1 ms.
BUSY_RETRIES = 6
#: A job past its timeout on the host's clock whose chips the runtime still reports healthy is not declared timed out
#: (the device is running it; a starved host ran the wait, or the mock's simulation, late) until a chip reports
#: otherwise, or until this many job timeouts have passed in all (a runtime that never reports a hang).
UNCONFIRMED_TIMEOUT_FACTOR = 5
#: A completion thread whose job has an end window (end_window.py) stands aside until this long past its close (at
#: most MAX_STAND_ASIDE_S: a clock a test drives by hand).
STAND_ASIDE_S = 1e-3
MAX_STAND_ASIDE_S = 0.05
#: Finished jobs' buffers kept for reuse per (graph, direction, batch): two banks, and one spare.
POOL_PER_SHAPE = 3
FAULT_STATUSES = frozenset(
    {
        RuntimeStatus.CCU_EXCEPTION,
        RuntimeStatus.UNKNOWN_DMA_STATE,
        RuntimeStatus.DEVICE_LOST,
        RuntimeStatus.TIMEOUT,
        RuntimeStatus.INTERNAL,
    }
)


@dataclass(eq=False)
class Inflight:
    """One submitted job and everything it holds until it completes (or the runtime lets go)."""

    core: PrefillJob | DecodeJob
    rt_job: RtJob
    inputs: HostBuffer
    outputs: HostBuffer
    seqs: tuple[KvSeqId, ...]
    request_ids: tuple[RequestId, ...]
    submitted: float
    graph: str
    engine: JobEngine = JobEngine.AUTO
    banked: bool = False  # submitted in ping/pong: it holds a BankSlots bank until it completes
    abandoned: bool = False  # retired or timed out: its completion thread stops waiting for it
    timeout_why: str = ""  # what confirmed the timeout (timed_out), for the outcome's detail
    late_logged: bool = False  # past the host's deadline while the device runs it: logged once
    window: Window | None = None  # when its waits are slices (end_window.py); None: plain waits
    handed: bool = False  # a completion thread waits for it (async, ping/pong)

    @property
    def job_id(self) -> JobId:
        return self.core.job_id

    @property
    def kind(self) -> str:
        return "prefill" if isinstance(self.core, PrefillJob) else "decode"


@dataclass(frozen=True)
class JobDone:
    """Inbox message from a completion thread: the runtime reports the job finished."""

    job_id: JobId


@dataclass(frozen=True)
class JobTimedOut:
    """Inbox message from a completion thread: no completion within ``job_timeout_s``."""

    job_id: JobId


@dataclass
class Finished:
    """What the runtime says about a completed job: the outcome without lane results, and the logits.

    ``outcome.status`` OK means device and output succeeded and the KV was committed; the core samples
    ``logits`` and fills in the lane results."""

    outcome: JobOutcome
    logits: np.ndarray | None = None
    runtime_status: RuntimeStatus | None = None


class LaunchFailed(Exception):
    pass


class DeviceExecutor:
    def __init__(
        self,
        alias: str,
        model: Model,
        metrics: EngineMetrics,
        monitor: ExecutorMonitor,
        *,
        post: Callable[[object], None],
        job_timeout_s: float,
        poll_s: float,
        fixed_engine: bool,
        clock: Clock = time.monotonic,
    ) -> None:
        self.alias = alias
        self.model = model
        self.rt: Runtime | None = None
        self.lane_seq: dict[LaneId, KvSeqId] = {}
        self.inflight: dict[JobId, Inflight] = {}
        self.quarantine: dict[JobId, Inflight] = {}
        self.slots = BankSlots()
        self._monitor = monitor
        self._metrics = metrics
        self._post = post
        self._clock = clock
        self.job_timeout_s = job_timeout_s
        self.poll_s = poll_s
        self.fixed_engine = fixed_engine
        self._handoff: queue.SimpleQueue[Inflight | None] = queue.SimpleQueue()
        self._completers: list[threading.Thread] = []
        self._width = model.prefill.input("tokens").concrete_shape(1)[1]
        self._m_busy = metrics.submit_busy.labels(alias)
        self._m_fill = metrics.batch_fill.labels(alias)
        self._m_compiled = metrics.compiled_batch.labels(alias)
        self._m_active = metrics.active_lanes.labels(alias)
        self._m_waste = metrics.lane_waste.labels(alias)
        self._m_jobs: dict[tuple[str, str], Any] = {}  # (graph kind, result) -> counter child
        self._m_job_s: dict[str, Any] = {}  # graph -> histogram child
        self._verdicts: list[Downgrade] = []  # monitor verdicts for the core to act on (it owns the mode)
        # Host buffers back from finished jobs, by (graph, direction, batch), reused for the next job instead
        # of a release + alloc per token. Only a buffer the runtime gave back (owned by us) is pooled; a
        # quarantined one never is. Released at retire/detach, so an unload leaves nothing allocated.
        self._pool: dict[tuple[str, bool, int], list[HostBuffer]] = {}
        self._m_submitted: dict[int, Any] = {}  # chip -> jobs_submitted counter child
        # Metering and records of the step's finished and launched jobs that the device need not wait for: run
        # by the core after the step's launches (bookkeeping()), so a job's end is not held up on its way to the
        # next submit. Each entry has its values captured already.
        self._after: list[Callable[[], None]] = []
        # When each in-flight job should end, from the jobs of its shape before it: the waits for it shorten
        # into slices just before (end_window.py: a thread asleep for a whole step wakes late on a VM).
        self.ends = EndWindows()

    # ------------------------------------------------------------------ submit

    def launch(
        self, job: PrefillJob | DecodeJob, prompt: tuple[int, ...] | None, *, pingpong: bool
    ) -> Inflight | JobOutcome:
        """Prepare and submit ``job``. Returns the job in flight, or the failed outcome if it was not submitted
        (its KV appends rolled back, its buffers released). ``prompt``: the request's tokens, for a prefill."""
        rt = self.rt
        assert rt is not None
        appended: list[KvSeqId] = []
        inputs = outputs = None
        engine, banked = JobEngine.AUTO, False
        try:
            if isinstance(job, PrefillJob):
                graph = job.graph
                if prompt is None:
                    raise LaunchFailed("request vanished before its prefill")
                seq = self.lane_seq.get(job.kv_lane)
                if seq is None:
                    seq = rt.kv.allocate(self.alias)
                    self.lane_seq[job.kv_lane] = seq
                tokens = np.zeros((1, self._width), dtype=np.int32)
                tokens[0, : len(prompt)] = prompt
                pos = rt.kv.append(seq, len(prompt))
                appended.append(seq)
                if pos != 0:
                    raise LaunchFailed(f"KV sequence {seq} starts at {pos}, expected 0 for a prefill")
                inputs, outputs = self._buffers(rt, graph, 1, lanes=1)
                inputs.write("tokens", tokens)
                inputs.write("n_tokens", np.array([len(prompt)], dtype=np.int32))
                seqs: tuple[KvSeqId, ...] = (seq,)
                rids: tuple[RequestId, ...] = (job.request_id,)
                kv_arg: list[KvSeqId | None] = [seq]
            else:
                batch = job.batch
                graph = batch.profile.graph
                b = batch.profile.compiled_batch
                seq_list = [self.lane_seq.get(lane) for lane in batch.kv_lanes]
                if any(s is None for s in seq_list):
                    raise LaunchFailed("a decode lane has no runtime KV sequence")
                seqs = tuple(s for s in seq_list if s is not None)
                for i, s in enumerate(seqs):
                    pos = rt.kv.append(s, 1)
                    appended.append(s)
                    if pos != batch.positions[i]:  # 000 §9.2 rule 4
                        raise LaunchFailed(
                            f"lane {batch.kv_lanes[i]}: KV position {pos} != scheduled position {batch.positions[i]}"
                        )
                inputs, outputs = self._buffers(rt, graph, b, lanes=len(seqs))
                inputs.write("tokens", np.array(batch.token_ids, dtype=np.int32).reshape(b, 1))
                inputs.write("positions", np.array(batch.positions, dtype=np.int32))
                # A graph compiled with B>1 profiles has a lane_valid slot at B1 too: an unwritten one reads
                # as "lane 0 inactive" (000 §7.3), so write it whenever the layout has it.
                if "lane_valid" in inputs.names:
                    inputs.write("lane_valid", np.array(batch.lane_valid, dtype=np.uint8))
                kv_arg = list(seqs) + [None] * (b - len(seqs))
                rids = batch.request_ids
                self._after.append(functools.partial(self._meter_batch, batch.fill_ratio, b, len(rids)))
            engine, banked = self._choose_engine(job, inputs, outputs, seqs, rids, pingpong=pingpong)
            rt_job = self._submit_with_backoff(rt, graph, inputs, outputs, kv_arg, job, engine)
        except SlotConflict as exc:  # 000 §14: the two ping/pong jobs would share state
            self._monitor_verdict(self._monitor.crosstalk(f"at submit: {exc}"))
            return self._abort(rt, job, appended, inputs, outputs, JobStatus.FAILED, f"refused: {exc}")
        except LaunchFailed as exc:
            return self._abort(rt, job, appended, inputs, outputs, JobStatus.FAILED, str(exc))
        except DeviceBusy as exc:
            detail = f"device busy after {BUSY_RETRIES} retries: {exc}"
            return self._abort(rt, job, appended, inputs, outputs, JobStatus.FAILED, detail)
        except RuntimeLayerError as exc:
            status = JobStatus.FAULT if exc.status in {int(s) for s in FAULT_STATUSES} else JobStatus.FAILED
            self._metrics.device_errors.labels(self.alias, type(exc).__name__).inc()
            return self._abort(rt, job, appended, inputs, outputs, status, f"{type(exc).__name__}: {exc}")
        inf = Inflight(job, rt_job, inputs, outputs, seqs, tuple(rids), self._clock(), graph, engine, banked)
        if not self.inflight:  # alone on the device: it starts now, so its end can be expected
            inf.window = self.ends.window(job_shape(inf.graph, inf.core, len(inf.seqs)), inf.submitted)
        self.inflight[job.job_id] = inf
        return inf

    def _meter_batch(self, fill: float, compiled: int, active: int) -> None:
        self._m_fill.observe(fill)
        self._m_compiled.set(compiled)
        self._m_active.set(active)
        self._m_waste.inc(compiled - active)

    def bookkeeping(self) -> None:
        """Meter and record the jobs finished and launched since the last call (the core calls it once the
        step's jobs are submitted, before it delivers the step's events)."""
        work, self._after = self._after, []
        for fn in work:
            fn()

    def _buffers(self, rt: Runtime, graph: str, batch: int, *, lanes: int) -> tuple[HostBuffer, HostBuffer]:
        """Input and output buffers for one job of ``lanes`` active lanes: pooled ones (zeroed) when there are, else
        new ones. Of a pooled output buffer only the active lanes' rows are zeroed: they are all the engine reads
        of it (:meth:`_read_output`), and a B8 buffer's whole logits are 1.5 MB for SmolLM2."""
        out = []
        for is_input in (True, False):
            pool = self._pool.get((graph, is_input, batch))
            if pool:
                buf = pool.pop()
                # nothing of the previous job is readable by, or mistaken for, this one
                buf.clear(lanes=None if is_input else lanes)
            else:
                buf = rt.alloc_inputs(graph, batch) if is_input else rt.alloc_outputs(graph, batch)
            out.append(buf)
        return out[0], out[1]

    def _recycle(self, inf: Inflight) -> None:
        """A finished job's buffers back to the pool; ones the runtime still holds stay with the quarantine."""
        for buf, is_input in ((inf.inputs, True), (inf.outputs, False)):
            if buf.state is BufferState.OWNED_BY_CALLER:
                pool = self._pool.setdefault((buf.graph, is_input, buf.batch), [])
                if len(pool) < POOL_PER_SHAPE:
                    pool.append(buf)
                    continue
            self._release_one(buf)

    def _release_one(self, buf: HostBuffer) -> None:
        if self.rt is not None:
            with contextlib.suppress(RuntimeLayerError):
                self.rt.release_buffer(buf)

    def release_pool(self) -> None:
        """Give every pooled buffer back to the runtime (unload, reset, detach)."""
        pools, self._pool = self._pool, {}
        for pool in pools.values():
            for buf in pool:
                self._release_one(buf)

    def hand_to_completer(self, inf: Inflight) -> None:
        """async / pingpong: a completion thread waits for ``inf`` and posts its end to the inbox (once a job)."""
        if inf.handed:
            return
        inf.handed = True
        if len(self._completers) < 2:
            # One completion thread per bank: each waits for one job, so a short job finishing first never
            # waits behind a long one (000 §14: two in flight).
            t = threading.Thread(
                target=self._completion_loop, name=f"engine-{self.alias}-completion{len(self._completers)}", daemon=True
            )
            self._completers.append(t)
            t.start()
        self._handoff.put(inf)

    def _choose_engine(
        self,
        job: PrefillJob | DecodeJob,
        inputs: HostBuffer,
        outputs: HostBuffer,
        seqs: tuple[KvSeqId, ...],
        rids: tuple[RequestId, ...],
        *,
        pingpong: bool,
    ) -> tuple[JobEngine, bool]:
        """(engine, banked): the free ping/pong bank in ping/pong (nothing shared with the other job, else
        SlotConflict), else ``auto`` (``ping`` with ``fixed_engine``). The mode in use now decides: a mode
        change affects only jobs not yet submitted (000 §14)."""
        if not pingpong:
            return (JobEngine.PING if self.fixed_engine else JobEngine.AUTO), False
        bank = self.slots.claim(job.job_id, inputs, outputs, seqs, rids)
        if bank is None:
            raise LaunchFailed(f"both ping/pong banks hold a job ({self.slots.holders()})")
        return bank, True

    def _submit_with_backoff(
        self,
        rt: Runtime,
        graph: str,
        inputs: HostBuffer,
        outputs: HostBuffer,
        kv: list[KvSeqId | None],
        job: PrefillJob | DecodeJob,
        engine: JobEngine,
    ) -> RtJob:
        delay = 0.001
        for attempt in range(BUSY_RETRIES + 1):
            try:
                rt_job = rt.submit(
                    graph, inputs, outputs, engine, kv=kv, generation=RtGenerationId(int(job.generation))
                )
            except DeviceBusy:
                self._m_busy.inc()
                self._monitor_verdict(self._monitor.submit_busy())  # 000 §14: consecutive DeviceBusy
                if attempt == BUSY_RETRIES:
                    raise
                time.sleep(delay)
                delay *= 2
            else:
                self._monitor.submit_ok()
                self._after.append(functools.partial(self._count_submitted, rt_job.chips))
                return rt_job
        raise AssertionError("unreachable")

    def _abort(
        self,
        rt: Runtime,
        job: PrefillJob | DecodeJob,
        appended: list[KvSeqId],
        inputs: HostBuffer | None,
        outputs: HostBuffer | None,
        status: JobStatus,
        detail: str,
    ) -> JobOutcome:
        log.warning("engine %s: job %s not submitted: %s", self.alias, job.job_id, detail)
        if status is JobStatus.FAILED:
            for s in appended:
                with contextlib.suppress(RuntimeLayerError):
                    rt.kv.rollback(s)
        for buf in (inputs, outputs):
            if buf is not None:
                with contextlib.suppress(RuntimeLayerError):
                    rt.release_buffer(buf)
        self._count_job("prefill" if isinstance(job, PrefillJob) else "decode", "not_submitted")
        self.slots.release(job.job_id)
        return JobOutcome(job.job_id, job.generation, status, detail=detail)

    def _count_submitted(self, chips: tuple[int, ...]) -> None:
        for chip in chips:
            child = self._m_submitted.get(chip)
            if child is None:
                child = self._m_submitted[chip] = self._metrics.jobs_submitted.labels(self.alias, str(chip))
            child.inc()

    def _count_job(self, kind: str, result: str) -> None:
        child = self._m_jobs.get((kind, result))
        if child is None:
            child = self._m_jobs[(kind, result)] = self._metrics.jobs.labels(self.alias, kind, result)
        child.inc()

    # ------------------------------------------------------------------ verdicts for the monitor

    def _monitor_verdict(self, verdict: Downgrade | None) -> None:
        """Collected for the core, which owns the executor mode and acts on them after the call."""
        if verdict is not None:
            self._verdicts.append(verdict)

    def take_verdicts(self) -> list[Downgrade]:
        out, self._verdicts = self._verdicts, []
        return out

    # ------------------------------------------------------------------ waiting

    def wait_s(self, inf: Inflight, timeout: float) -> float:
        """How long the next wait for ``inf`` should be, at most ``timeout`` (:mod:`end_window`)."""
        return timeout if inf.window is None else inf.window.wait_s(self._clock(), timeout)

    def soonest_wait_s(self, timeout: float | None) -> float | None:
        """The engine's inbox wait, at most ``timeout`` (None: none), cut to end when a job's window opens (0 when
        one is open already: it opened since the core last looked, and the core waits on that job, not the inbox)."""
        now = self._clock()
        opens = [max(0.0, i.window.opens - now) for i in self.inflight.values() if i.window and now < i.window.closes]
        return min(opens, default=None) if timeout is None else min([*opens, timeout])

    def due_now(self) -> Inflight | None:
        """A job in flight whose window is open, or None. async, ping/pong: the core waits on it itself, so its end
        wakes the core directly, not through its completion thread's post (:mod:`end_window`)."""
        now = self._clock()
        return next((i for i in self.inflight.values() if i.window is not None and i.window.is_open(now)), None)

    def wait_inline(self, inf: Inflight, timeout: float) -> bool:
        """sync mode: wait on the core's thread for ``inf`` at most ``timeout`` seconds. True when it is done."""
        rt = self.rt
        if rt is None:
            return False
        try:
            return bool(rt.wait_any([inf.rt_job], timeout=max(0.0, timeout)))
        except RuntimeLayerError as exc:
            log.error("engine %s: waiting for job %s failed: %s", self.alias, inf.job_id, exc)
            return False

    def timed_out(self, inf: Inflight) -> bool:
        """Is ``inf`` timed out (001 §11.3 Wait timeout)? Past ``job_timeout_s`` on the host's clock, and the
        device confirms it: the job is not finished and one of its chips reports hung, faulted or unknown (or
        health cannot be read). While every chip of the job reports OK the device is running it and the delay
        is the host's (a starved waiting thread; on the mock, its simulating thread), so it is not a verdict
        about the chip: the timeout is declared only after :data:`UNCONFIRMED_TIMEOUT_FACTOR` job timeouts."""
        elapsed = self._clock() - inf.submitted
        if elapsed <= self.job_timeout_s:
            return False
        if elapsed > self.job_timeout_s * UNCONFIRMED_TIMEOUT_FACTOR:
            inf.timeout_why = (
                f"no completion after {elapsed:.1f}s ({UNCONFIRMED_TIMEOUT_FACTOR} x the {self.job_timeout_s:g}s "
                "job timeout, the runtime reporting its chips healthy)"
            )
            return True
        hang = self._device_hang(inf)
        if hang is None:
            if not inf.late_logged:
                inf.late_logged = True
                log.info(
                    "engine %s: job %s past its %gs timeout on the host's clock; the runtime reports its chips OK, "
                    "so it is not timed out (host delay, not a device verdict)",
                    self.alias,
                    inf.job_id,
                    self.job_timeout_s,
                )
            return False
        inf.timeout_why = f"no completion after {self.job_timeout_s:.1f}s ({hang})"
        return True

    def _device_hang(self, inf: Inflight) -> str | None:
        """What the runtime says against ``inf`` still running normally, or None: it finished (the next wait
        sees it) or every chip it runs on reports OK."""
        rt = self.rt
        if rt is None:
            return "no runtime attached"
        try:
            if rt.query(inf.rt_job).state.terminal:
                return None
            health = {h.chip: h for h in rt.health()}
        except RuntimeLayerError as exc:
            return f"the runtime cannot report the job or its chips' health: {exc}"
        for chip in inf.rt_job.chips:
            h = health.get(chip)
            if h is None or h.health is not Health.OK:
                state = h.health.value if h is not None else "not reported"
                return f"chip {chip} reports {state}" + (f": {h.detail}" if h is not None and h.detail else "")
        return None

    def _completion_loop(self) -> None:
        """A completion thread: wait for the next handed-over job, post its end to the inbox. Nothing else."""
        while True:
            inf = self._handoff.get()
            if inf is None:
                return
            if inf.window is not None:  # the core waits on it in its window; woken too, this thread would only
                # take the interpreter lock from the core's next launch. A dict lookup is safe from this thread.
                time.sleep(min(MAX_STAND_ASIDE_S, max(0.0, inf.window.closes + STAND_ASIDE_S - self._clock())))
                if inf.job_id not in self.inflight:
                    continue
            while not inf.abandoned:
                rt = self.rt
                if rt is None:
                    break
                try:
                    done = rt.wait_any([inf.rt_job], timeout=self.poll_s)
                except RuntimeLayerError as exc:
                    log.error("engine %s: waiting for job %s failed: %s", self.alias, inf.job_id, exc)
                    done = []
                    time.sleep(self.poll_s)
                if done:
                    self._post(JobDone(inf.job_id))
                    break
                if self.timed_out(inf):
                    self._post(JobTimedOut(inf.job_id))
                    break

    def stop_completers(self) -> None:
        for _ in self._completers:
            self._handoff.put(None)
        for t in self._completers:
            t.join(timeout=5)

    # ------------------------------------------------------------------ completion

    def time_out(self, inf: Inflight) -> JobOutcome | None:
        """001 §11.3: Wait timeout -> lanes Unknown, quarantine (never free its buffers). The job keeps its
        ping/pong bank until the runtime gives its buffers back. None if it was no longer in flight."""
        if self.inflight.pop(inf.job_id, None) is None:
            return None
        inf.abandoned = True
        self.quarantine[inf.job_id] = inf
        self._monitor_verdict(self._monitor.job_timed_out())
        self._metrics.device_errors.labels(self.alias, "Timeout").inc()
        self._count_job(inf.kind, "timeout")
        self._record_job(self.rt, inf, JobStatus.TIMEOUT.value, None, None, None)
        detail = inf.timeout_why or f"no completion after {self.job_timeout_s:.1f}s"
        return JobOutcome(inf.job_id, inf.core.generation, JobStatus.TIMEOUT, detail=detail)

    def finish(self, inf: Inflight) -> Finished | None:
        """The runtime says ``inf`` is done: check its answer, read its logits, commit or roll back its KV, give its
        buffers back. None if it was no longer in flight (retired meanwhile: the quarantine sweep releases it)."""
        if self.inflight.pop(inf.job_id, None) is None:
            return None
        rt = self.rt
        assert rt is not None
        res = rt.query(inf.rt_job)
        kv_before = self._kv_lengths(inf)
        took = self._clock() - inf.submitted
        if res.ok:  # the device's own time when it tells one the host could have seen (steadier than its wake-ups)
            device_s = res.device_seconds
            plausible = device_s is not None and 0.0 <= device_s <= took  # not 1e18 ns, not ended before it began
            self.ends.observe(
                job_shape(inf.graph, inf.core, len(inf.seqs)), device_s if plausible and device_s is not None else took
            )
        job, gen = inf.job_id, inf.core.generation
        fin: Finished
        counted: str  # the job's result label in calctl_jobs_total
        anomaly = status_anomaly(inf.rt_job, res)
        if anomaly is not None:  # the runtime's answer contradicts itself: trust nothing it wrote
            fin = Finished(JobOutcome(job, gen, JobStatus.FAULT, detail=f"status anomaly: {anomaly}"))
            self._monitor_verdict(self._monitor.status_anomaly(anomaly))
            counted = "bad_output"
        elif res.ok:
            fin = self._read_output(inf)
            if fin.outcome.status is JobStatus.OK:
                try:
                    for s in inf.seqs:
                        rt.kv.commit(s)  # device and output succeeded (000 §9.2 rule 5)
                except RuntimeLayerError as exc:
                    # A reset of the configuration (another alias's board recovery) dropped the sequences while
                    # the job ran: its output cannot be kept and its lanes' KV is unknown (000 §7.4).
                    fin = Finished(
                        JobOutcome(job, gen, JobStatus.FAILED, detail=f"KV commit refused: {exc}", kv_unknown=True)
                    )
            counted = "ok" if fin.outcome.status is JobStatus.OK else "bad_output"
        else:
            status_code = (
                RuntimeStatus(res.status) if res.status in RuntimeStatus._value2member_map_ else RuntimeStatus.INTERNAL
            )
            self._metrics.device_errors.labels(self.alias, status_code.name).inc()
            counted = "failed"
            status = (
                JobStatus.FAULT
                if status_code in FAULT_STATUSES or status_code is RuntimeStatus.JOB_ABORTED
                else JobStatus.FAILED
            )
            # A submitted job that failed with a non-fault status (out of memory, invalid argument) may have
            # written part of its KV: never roll it back as if nothing happened; the lanes go Unknown (000 §7.4).
            fin = Finished(
                JobOutcome(
                    job,
                    gen,
                    status,
                    detail=f"{status_code.name}: {res.detail or ''}".strip(),
                    kv_unknown=status is JobStatus.FAILED,
                ),
                runtime_status=status_code,
            )
        if fin.outcome.status is JobStatus.FAULT:
            self.try_release(inf)  # never reuse what a faulted job touched
        else:
            self._recycle(inf)
        self.slots.release(job)
        if fin.outcome.status is JobStatus.OK:
            self._monitor.job_completed()
        kv_after = self._kv_lengths(inf)
        self._after.append(
            functools.partial(
                self._book_finished, rt, inf, took, counted, fin.outcome.status.value, res, kv_before, kv_after
            )
        )
        return fin

    def _book_finished(
        self,
        rt: Runtime,
        inf: Inflight,
        took: float,
        counted: str,
        status: str,
        res: JobResult,
        kv_before: list[int | None],
        kv_after: list[int | None],
    ) -> None:
        hist = self._m_job_s.get(inf.graph)
        if hist is None:
            hist = self._m_job_s[inf.graph] = self._metrics.job_seconds.labels(self.alias, inf.graph)
        hist.observe(took)
        self._count_job(inf.kind, counted)
        self._record_job(rt, inf, status, res, kv_before, kv_after)

    def _kv_lengths(self, inf: Inflight) -> list[int | None]:
        """Each lane's committed KV tokens (None: the runtime could not tell)."""
        assert self.rt is not None
        out: list[int | None] = []
        for s in inf.seqs:
            try:
                out.append(self.rt.kv.length(s).committed)
            except RuntimeLayerError:
                out.append(None)
        return out

    def _record_job(
        self,
        rt: Runtime | None,
        inf: Inflight,
        status: str,
        res: JobResult | None,
        kv_before: list[int | None] | None,
        kv_after: list[int | None] | None,
    ) -> None:
        """001 §14's per-job record (calctl.serving.record_sink), always kept by the flight recorder. Phases come
        from the runtime's own trace (``rt``: the job's runtime), read only when records are written (a kept-only
        record gets them from the recovery evidence's trace window); a runtime that reports none gives null,
        never a made-up split."""
        job = inf.rt_job
        phases = (
            job_phases(rt.trace(since_ns=job.submit_ns), job.id)
            if rt is not None and self._metrics.records.enabled
            else {}
        )
        done = res is not None and res.end_ns is not None
        self._metrics.records.job(
            runtime_job=job.id,
            job_id=int(inf.job_id),
            model_alias=self.alias,
            generation=int(inf.core.generation),
            graph=inf.graph,
            kind=inf.kind,
            engine=inf.engine.value,
            chips=list(job.chips),
            lanes=len(inf.request_ids),
            submit_ns=job.submit_ns,
            done_ns=res.end_ns if done and res is not None else None,
            h2d_ms=phases.get("h2d"),
            infer_ms=phases.get("compute"),
            d2h_ms=phases.get("d2h"),
            device_ms=ms(res.device_seconds) if res is not None else None,
            output_status=status,
            kv_before=kv_before,
            kv_after=kv_after,
            reset_generation=None,  # the runtime reports no reset epoch per job (vendor gap, docs/serve.md)
        )

    def _read_output(self, inf: Inflight) -> Finished:
        """A succeeded job's logits after the crosstalk checks (000 §14)."""
        job, gen = inf.job_id, inf.core.generation
        try:
            # The active lanes' rows only (lanes 0..n-1): what inactive lanes return is the package's
            # inactive_lane_policy (returns_logits false: unspecified), so it is neither read nor judged.
            logits = inf.outputs.read("logits", lanes=len(inf.request_ids))
        except RuntimeLayerError as exc:  # e.g. the buffer is still lent to another job: never read it
            detail = f"output of job {job} unreadable: {exc}"
            self._monitor_verdict(self._monitor.crosstalk(detail))
            return Finished(JobOutcome(job, gen, JobStatus.FAULT, detail=detail))
        fault = logits_fault(logits)
        if fault is not None:
            detail = f"corrupted output: {fault} in job {job}"
            self._monitor_verdict(self._monitor.crosstalk(detail))
            return Finished(JobOutcome(job, gen, JobStatus.FAULT, detail=detail))
        if inf.banked:
            problem = self.slots.check_completion(job, inf.engine, inf.request_ids)
            if problem is not None:
                self._monitor_verdict(self._monitor.crosstalk(problem))
                return Finished(JobOutcome(job, gen, JobStatus.FAULT, detail=f"crosstalk: {problem}"))
        return Finished(JobOutcome(job, gen, JobStatus.OK), logits=logits)

    def try_release(self, inf: Inflight) -> bool:
        rt = self.rt
        if rt is None:
            return False
        ok = True
        for buf in (inf.inputs, inf.outputs):
            try:
                rt.release_buffer(buf)
            except RuntimeLayerError:
                ok = False  # still owned by a job (or an unknown DMA state): keep it quarantined
        return ok

    def sweep_quarantine(self) -> list[JobOutcome]:
        """Release quarantined jobs the runtime has let go of; their late completions (stale for the scheduler,
        000 §4 rule 4) are returned for ``update_from_output``."""
        rt = self.rt
        if rt is None or not self.quarantine:
            return []
        late = []
        for job_id, inf in list(self.quarantine.items()):
            if rt.query(inf.rt_job).state.terminal and self.try_release(inf):
                del self.quarantine[job_id]
                self.slots.release(job_id)
                late.append(JobOutcome(job_id, inf.core.generation, JobStatus.FAILED, detail="late completion"))
        return late

    # ------------------------------------------------------------------ lifecycle

    def retire(self) -> None:
        """Every job in flight is quarantined: its buffers are kept until the runtime gives them back."""
        self.release_pool()
        self.ends.forget()
        for job_id, inf in list(self.inflight.items()):
            inf.abandoned = True
            self.quarantine[job_id] = inf
        self.inflight.clear()

    def free_lane(self, lane: LaneId) -> None:
        seq = self.lane_seq.pop(lane, None)
        if seq is not None and self.rt is not None:
            try:
                self.rt.kv.free(seq)
            except RuntimeLayerError as exc:
                log.warning("engine %s: freeing KV sequence %s failed: %s", self.alias, seq, exc)

    def forget_device_state(self) -> None:
        """After a reset: free every runtime KV sequence and release buffers the runtime gave back."""
        self.release_pool()
        self.ends.forget()
        rt = self.rt
        seqs = list(self.lane_seq.values())
        self.lane_seq.clear()
        if rt is None:
            return
        for seq in seqs:
            with contextlib.suppress(RuntimeLayerError):  # the reset already dropped it
                rt.kv.free(seq)
        for job_id, inf in list(self.quarantine.items()):
            if self.try_release(inf):
                del self.quarantine[job_id]
                self.slots.release(job_id)


__all__ = [
    "BUSY_RETRIES",
    "UNCONFIRMED_TIMEOUT_FACTOR",
    "DeviceExecutor",
    "Finished",
    "Inflight",
    "JobDone",
    "JobTimedOut",
]
