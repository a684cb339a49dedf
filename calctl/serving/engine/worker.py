"""ModelWorker: one alias, one chip, one submit/completion loop (001 §4, §10.2; 000 §3).

The worker owns its scheduler (``calctl.serving.core.Scheduler``), the map from
the scheduler's KV lanes to runtime KV sequences, the host buffers of its jobs
in flight, and the streams of its requests. Its thread runs the vLLM-style
step::

    schedule(now) -> submit jobs -> wait -> update_from_output -> events

How the wait happens is the executor mode (000 §14, docs/executor.md):
``sync`` waits inline on the worker thread for the one job it submitted;
``async`` and ``pingpong`` hand the wait to completion threads (one per bank),
so submission never blocks on a wait, with one job in flight (``async``) or two
on alternating ping/pong banks (``pingpong``). In ping/pong the two jobs share
nothing (:class:`~calctl.serving.engine.executor.BankSlots` checks it), and the
:class:`~calctl.serving.engine.monitor.ExecutorMonitor` downgrades to one job
in flight when 000 §14's conditions fire; jobs already submitted drain. Only an
operator goes back to ping/pong (:meth:`ModelWorker.set_executor_mode`).

Rules kept here (001 §10.3):

* the worker lock guards scheduler state only and is never held while waiting
  on the device; a worker never touches another worker's lock;
* a job's buffers are exclusively the job's from submit to completion; a
  timed-out job's buffers are quarantined until the runtime gives them back;
* KV commit only after device *and* output success (non-finite logits are a
  fault), rollback after a clean failure, Unknown after a timeout or fault;
* a completion from a retired generation is dropped (StaleCompletion) but its
  buffers are still released (000 §4 rule 4);
* a recovery request waits until this worker's other jobs in flight have
  completed (or timed out), so a fault in one ping/pong job never drops its
  sibling (000 §14: submitted jobs drain).

Recovery and lifecycle decisions belong to the DeviceSupervisor; the worker
only reports ``RecoveryNeeded`` and follows instructions.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calctl.errors import ConfigError
from calctl.package.model import Model
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.errors import DeviceBusy, RuntimeLayerError, RuntimeStatus
from calctl.runtime.interface import Runtime
from calctl.runtime.types import Engine as JobEngine
from calctl.runtime.types import GenerationId as RtGenerationId
from calctl.runtime.types import Job as RtJob
from calctl.runtime.types import JobResult, KvSeqId
from calctl.serving.config import DowngradePolicy, ExecutorMode
from calctl.serving.core import admission as core_admission
from calctl.serving.core.admission import AdmissionResult, ModelState, Verdict
from calctl.serving.core.ids import GenerationId, JobId, LaneId, RequestId, TenantId
from calctl.serving.core.request import FinishReason as CoreFinish
from calctl.serving.core.request import TerminalEvent
from calctl.serving.core.scheduler import (
    DecodeJob,
    JobOutcome,
    JobStatus,
    LaneReleased,
    LaneResult,
    PrefillJob,
    RecoveryNeeded,
    Scheduler,
    SchedulerSettings,
    StaleCompletion,
    TokenEmitted,
)
from calctl.serving.engine.executor import BankSlots, DowngradeReason, DowngradeRecord, SlotConflict
from calctl.serving.engine.metrics import EngineMetrics, ModelSnapshot
from calctl.serving.engine.monitor import Downgrade, ExecutorMonitor
from calctl.serving.engine.streams import EngineStream
from calctl.serving.protocol import (
    EngineRejection,
    FinishReason,
    GenerationRequest,
    RejectCode,
    SamplingParams,
    TokenEvent,
)
from calctl.serving.text import TextCodec

log = logging.getLogger("calctl.serve")
Clock = Callable[[], float]

#: 001 §11.3 "DeviceBusy -> bounded backoff": at most this many retries, doubling from 1 ms.
BUSY_RETRIES = 6
#: How often the worker reads its chip's counters for the downgrade monitor (000 §14).
COUNTER_CHECK_S = 0.25
MAX_DOWNGRADE_RECORDS = 100
FAULT_STATUSES = frozenset(
    {
        RuntimeStatus.CCU_EXCEPTION,
        RuntimeStatus.UNKNOWN_DMA_STATE,
        RuntimeStatus.DEVICE_LOST,
        RuntimeStatus.TIMEOUT,
        RuntimeStatus.INTERNAL,
    }
)


@dataclass
class _Request:
    gen: GenerationRequest
    stream: EngineStream
    arrived: float
    rng: np.random.Generator
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_job_at: float | None = None
    tokens: int = 0
    end_reason: FinishReason | None = None  # set by finish(): a stop string ended it


@dataclass
class _Inflight:
    core: PrefillJob | DecodeJob
    rt_job: RtJob
    inputs: HostBuffer
    outputs: HostBuffer
    seqs: tuple[KvSeqId, ...]
    request_ids: tuple[RequestId, ...]
    submitted: float
    graph: str
    engine: JobEngine = JobEngine.AUTO
    inline: bool = False  # sync mode: the worker thread waits for it; else a completion thread does
    banked: bool = False  # submitted in ping/pong: it holds a BankSlots bank until it completes


@dataclass
class RecoveryRequest:
    alias: str
    status: JobStatus
    detail: str
    runtime_status: RuntimeStatus | None


@dataclass
class WorkerOptions:
    """``mode``/``fixed_engine``/``downgrade`` come from the scheduler configuration's ``executor`` block
    (000 §15); ``chip_exclusive``: no other alias runs on this worker's chip (its counters are ours)."""

    job_timeout_s: float = 30.0
    poll_s: float = 0.02
    mode: ExecutorMode = ExecutorMode.SYNC
    fixed_engine: bool = False
    downgrade: DowngradePolicy = field(default_factory=DowngradePolicy)
    chip_exclusive: bool = True


class ModelWorker:
    def __init__(
        self,
        alias: str,
        model: Model,
        codec: TextCodec,
        settings: SchedulerSettings,
        metrics: EngineMetrics,
        *,
        on_recovery: Callable[[RecoveryRequest], None],
        options: WorkerOptions | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.alias = alias
        self.model = model
        self.codec = codec
        self.options = options or WorkerOptions()
        self._metrics = metrics
        self._on_recovery = on_recovery
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._rt: Runtime | None = None
        self._serving = False
        self._display_state = ModelState.UNLOADED
        self._reject_all_as_unavailable = False
        self._sched = Scheduler(settings, generation=GenerationId(0), model_state=ModelState.UNLOADED)
        self._requests: dict[RequestId, _Request] = {}
        self._lane_seq: dict[LaneId, KvSeqId] = {}
        self._inflight: dict[JobId, _Inflight] = {}
        self._quarantine: dict[JobId, _Inflight] = {}
        self._recovery_pending = False
        self._deferred_recovery: RecoveryRequest | None = None  # waits for the jobs still in flight to drain
        self._stale_probe: _StaleProbe | None = None  # diagnostic only (arm_stale_redelivery)
        # Executor (000 §14): the mode in use, the ping/pong banks, the downgrade monitor.
        if self.options.mode.max_inflight > settings.budget.max_inflight_jobs:
            raise ConfigError(
                f"{alias}: executor mode {self.options.mode.value} needs max_inflight "
                f"{self.options.mode.max_inflight}, the configuration allows {settings.budget.max_inflight_jobs}"
            )
        self._mode = self.options.mode
        self._sched.set_inflight_limit(self._mode.max_inflight)
        self._slots = BankSlots()
        self._monitor = ExecutorMonitor(self.options.downgrade, self._mode, chip_exclusive=self.options.chip_exclusive)
        self._downgrades: list[DowngradeRecord] = []  # automatic only (000 §14)
        self._operator_changes: list[dict[str, Any]] = []
        self._unclaimed: list[JobId] = []  # async/pingpong jobs no completion thread waits for yet
        self._completion_cv = threading.Condition(self._lock)
        self._next_counter_check = 0.0
        self._thread = threading.Thread(target=self._run, name=f"worker-{alias}", daemon=True)
        self._thread.start()
        # One completion thread per bank: each waits for one job, so a short job finishing first
        # never waits behind a long one (000 §14: two in flight).
        self._completers = [
            threading.Thread(target=self._completion_loop, name=f"worker-{alias}-completion{i}", daemon=True)
            for i in range(2)
        ]
        for t in self._completers:
            t.start()

    # ------------------------------------------------------------------ properties

    @property
    def state(self) -> ModelState:
        return self._display_state

    @property
    def generation(self) -> int:
        return int(self._sched.generation)

    @property
    def chips(self) -> tuple[int, ...]:
        return self.model.target_chips

    def is_ready(self) -> bool:
        return self._display_state is ModelState.READY and self._serving

    def live_requests(self) -> int:
        with self._lock:
            return len(self._requests)

    def inflight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def quarantined(self) -> int:
        with self._lock:
            return len(self._quarantine)

    def snapshot(self) -> ModelSnapshot:
        with self._lock:
            st = self._sched.stats()
        queues = {k.value.replace("prefill_", ""): v for k, v in st.prefill_depth.items()}
        queues["decode"] = st.decode_ready
        return ModelSnapshot(
            alias=self.alias,
            state=self._display_state.value,
            generation=self.generation if self._serving else None,
            queues=queues,
            waiting_requests=st.waiting_requests,
            waiting_prompt_tokens=st.waiting_prompt_tokens,
            kv_lanes={k.value: v for k, v in st.kv_by_state.items()},
            kv_reserved_tokens=st.kv_reserved_tokens,
            inflight_jobs=st.inflight_jobs,
            quarantined_jobs=st.quarantined_jobs,
            executor_mode=self._mode.value,
        )

    # ------------------------------------------------------------------ API side

    def submit(self, req: GenerationRequest, stream: EngineStream) -> None:
        """Admission is decided here, atomically, before the first byte (000 §5.2). Raises EngineRejection."""
        rid = RequestId(req.request_id)
        if not req.prompt_ids:
            raise EngineRejection(
                RejectCode.INVALID, "the prompt is empty: at least one token is needed", param="prompt"
            )
        if self._reject_all_as_unavailable:
            raise EngineRejection(
                RejectCode.UNAVAILABLE, f"model {self.alias!r} is being reloaded; retry shortly", retry_after_s=1.0
            )
        now = self._clock()
        with self._lock:
            ticket = self._sched.arrive(rid, TenantId(req.tenant), now)
            if isinstance(ticket, AdmissionResult):
                self._count_verdict(ticket)
                raise _rejection(ticket, self.alias)
            seed = req.sampling.seed
            self._requests[rid] = _Request(req, stream, now, np.random.default_rng(seed))
            result = self._sched.submit(
                ticket, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens, deadline_s=req.timeout_s, now=now
            )
            self._count_verdict(result)
            if not result.verdict.accepted:
                self._requests.pop(rid, None)
                self._pump(now)
                raise _rejection(result, self.alias)
            self._metrics.prompt_tokens.labels(self.alias).inc(len(req.prompt_ids))
            if result.verdict is Verdict.ADMIT:
                stream.post_admitted()
            self._pump(now)
        self._wake.set()

    def cancel(self, request_id: str, reason: str = "cancelled", *, stop: bool = False) -> bool:
        rid = RequestId(request_id)
        now = self._clock()
        with self._lock:
            ctx = self._requests.get(rid)
            if ctx is None:
                return False
            if stop:
                ctx.end_reason = FinishReason.STOP
            self._sched.cancel(rid, now)
            self._pump(now)
        log.info("request %s on %s cancelled (%s)", request_id, self.alias, reason)
        self._wake.set()
        return True

    def _count_verdict(self, result: AdmissionResult) -> None:
        self._metrics.admission.labels(self.alias, result.verdict.value).inc()

    # ------------------------------------------------------------------ lifecycle (supervisor side)

    def set_state(self, state: ModelState, *, admission: ModelState | None = None) -> None:
        """Show ``state``; ``admission`` (default: the same) is what the scheduler admits under."""
        now = self._clock()
        with self._lock:
            self._display_state = state
            target = admission or state
            if self._sched.model_state is not target and not (target is ModelState.READY and not self._serving):
                self._sched.set_model_state(target, now)
            self._pump(now)
        self._wake.set()

    def set_rejecting(self, on: bool) -> None:
        """During a reload new requests get 503 (000 §11, 001 §11.2), not a wait."""
        self._reject_all_as_unavailable = on

    def publish(self, rt: Runtime, generation: int) -> None:
        """The new generation passed golden + warmup: serve it (000 §11 step 10)."""
        now = self._clock()
        with self._lock:
            self._rt = rt
            self._sched.recover(GenerationId(generation), now)
            self._serving = True
            self._display_state = ModelState.READY
            self._recovery_pending = False
            self._deferred_recovery = None
            self._monitor.reset_counters()  # a reset or reconfigure may have restarted them
            self._pump(now)
        self._reject_all_as_unavailable = False
        self._wake.set()

    def drained(self) -> bool:
        with self._lock:
            return not self._requests and not self._inflight

    def retire(self, reason: str) -> None:
        """Stop serving this generation: fail everything holding device state (000 §10, 001 §11.3)."""
        now = self._clock()
        with self._lock:
            self._serving = False
            self._sched.retire_generation(now, reason)
            self._pump(now)
            # Jobs in flight are quarantined by the scheduler; keep their buffers until the runtime lets go.
            for job_id, inf in list(self._inflight.items()):
                self._quarantine[job_id] = inf
            self._inflight.clear()
            self._unclaimed.clear()
            self._deferred_recovery = None  # this retirement is the recovery (or teardown) it waited for
            self._completion_cv.notify_all()
        self._wake.set()

    def forget_device_state(self) -> None:
        """After a reset: free every runtime KV sequence and release buffers the runtime gave back."""
        rt = self._rt
        with self._lock:
            seqs = list(self._lane_seq.values())
            self._lane_seq.clear()
            quarantined = list(self._quarantine.items())
        if rt is None:
            return
        for seq in seqs:
            with contextlib.suppress(RuntimeLayerError):  # the reset already dropped it
                rt.kv.free(seq)
        for job_id, inf in quarantined:
            if self._try_release(rt, inf):
                with self._lock:
                    self._quarantine.pop(job_id, None)
                    self._slots.release(job_id)

    def detach(self) -> None:
        with self._lock:
            self._serving = False
            self._rt = None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            self._completion_cv.notify_all()
        self._thread.join(timeout=5)
        for t in self._completers:
            t.join(timeout=5)

    def fail_all(self, reason: str) -> None:
        """Terminal failure of the generation (Failed): waiting and running requests get 503."""
        self.set_state(ModelState.FAILED)
        self.retire(reason)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # a bug must not kill the worker silently: log it, fail safe
                log.exception("worker %s: unexpected error in the engine loop", self.alias)
                time.sleep(0.05)

    def _step(self) -> None:
        wake_at, inline = self._schedule_and_launch()
        if not (inline and self._wait_inline()):
            # async/pingpong: completion threads wait for the device and wake us (_wake) when a job is done.
            timeout = (
                self.options.poll_s if wake_at is None else max(0.0, min(self.options.poll_s, wake_at - self._clock()))
            )
            self._wake.wait(timeout)
            self._wake.clear()
        self._sweep_quarantine()
        self._check_counters()

    def _schedule_and_launch(self) -> tuple[float | None, bool]:
        """One schedule() and the submission of what it hands out. Returns (wake_at, inline: sync mode)."""
        jobs: tuple[PrefillJob | DecodeJob, ...] = ()
        with self._lock:
            now = self._clock()
            # schedule() also expires deadlines and promotes waiters while the model loads; it hands
            # out jobs only in Ready/Draining and not while halted for recovery, and at most as many
            # as the executor mode lets be in flight (Scheduler.set_inflight_limit).
            out = self._sched.schedule(now)
            jobs, wake_at = out.jobs, out.wake_at
            serving = self._serving and self._rt is not None
            inline = self._mode is ExecutorMode.SYNC
            self._pump(now)
        if jobs and not serving:  # defensive: never submit outside a published generation
            for job in jobs:
                self._complete(
                    JobOutcome(job.job_id, job.generation, JobStatus.FAILED, detail="no generation is being served")
                )
            jobs = ()
        for job in jobs:
            self._launch(job, inline=inline)
        return wake_at, inline

    def _wait_inline(self) -> bool:
        """Sync mode: wait on the worker thread for the job it submitted; no other job overlaps it. True if it waited.

        Between wait slices the scheduler still runs (deadlines expire, waiters are promoted); it hands
        out no job while the one in flight fills the limit of 1, only after an operator raised it."""
        waited = False
        while not self._stop.is_set():
            rt = self._rt
            with self._lock:
                pending = [i for i in self._inflight.values() if i.inline]
            if rt is None or not pending:
                break
            waited = True
            self._await(rt, pending[0], tick=self._schedule_and_launch)
        return waited

    def _completion_loop(self) -> None:
        """async/pingpong: take the next submitted job and wait for it, so submission never waits."""
        while not self._stop.is_set():
            try:
                with self._lock:
                    while not self._unclaimed and not self._stop.is_set():
                        self._completion_cv.wait(1.0)  # notified on every submit and on stop/retire
                    if self._stop.is_set():
                        return
                    inf = self._inflight.get(self._unclaimed.pop(0))
                    rt = self._rt
                if inf is not None and rt is not None:
                    self._await(rt, inf)
                    self._wake.set()
            except Exception:  # a bug must not kill a completion thread silently
                log.exception("worker %s: unexpected error in a completion thread", self.alias)
                time.sleep(0.05)

    def _await(self, rt: Runtime, inf: _Inflight, *, tick: Callable[[], object] | None = None) -> None:
        """Wait for one job in ``poll_s`` slices (a retirement or stop is noticed; ``tick`` runs between
        slices) and complete it, or time it out."""
        while not self._stop.is_set():
            with self._lock:
                if self._inflight.get(inf.core.job_id) is not inf:
                    return  # retired meanwhile: it is quarantined and the sweep releases it
            try:
                done = rt.wait_any([inf.rt_job], timeout=self.options.poll_s)
            except RuntimeLayerError as exc:
                log.error("worker %s: waiting for job %s failed: %s", self.alias, inf.core.job_id, exc)
                done = []
                time.sleep(self.options.poll_s)
            if done:
                self._finish_job(rt, inf)
                return
            if self._clock() - inf.submitted > self.options.job_timeout_s:
                self._time_out(inf)
                return
            if tick is not None:
                tick()

    def _check_counters(self) -> None:
        """Feed the chip's job counters to the downgrade monitor (000 §14 counter anomalies)."""
        rt, now = self._rt, self._clock()
        if rt is None or not self._serving or now < self._next_counter_check:
            return
        self._next_counter_check = now + COUNTER_CHECK_S
        try:
            counters = rt.counters()
        except RuntimeLayerError as exc:
            log.warning("worker %s: reading chip counters failed: %s", self.alias, exc)
            return
        with self._lock:
            own = len(self._inflight) + len(self._quarantine)
            for c in counters:
                if c.chip in self.chips:
                    self._apply(self._monitor.counters(c, own_jobs=own, now=now))

    # ------------------------------------------------------------------ submit

    def _launch(self, job: PrefillJob | DecodeJob, *, inline: bool) -> None:
        rt = self._rt
        assert rt is not None
        appended: list[KvSeqId] = []
        inputs = outputs = None
        engine, banked = JobEngine.AUTO, False
        try:
            if isinstance(job, PrefillJob):
                graph = job.graph
                with self._lock:
                    ctx = self._requests.get(job.request_id)
                    seq = self._lane_seq.get(job.kv_lane)
                if ctx is None:
                    raise _LaunchFailed("request vanished before its prefill")
                if seq is None:
                    seq = rt.kv.allocate(self.alias)
                    with self._lock:
                        self._lane_seq[job.kv_lane] = seq
                prompt = ctx.gen.prompt_ids
                spec = self.model.prefill.input("tokens")
                width = spec.concrete_shape(1)[1]
                tokens = np.zeros((1, width), dtype=np.int32)
                tokens[0, : len(prompt)] = prompt
                pos = rt.kv.append(seq, len(prompt))
                appended.append(seq)
                if pos != 0:
                    raise _LaunchFailed(f"KV sequence {seq} starts at {pos}, expected 0 for a prefill")
                inputs, outputs = rt.alloc_inputs(graph), rt.alloc_outputs(graph)
                inputs.write("tokens", tokens)
                inputs.write("n_tokens", np.array([len(prompt)], dtype=np.int32))
                seqs: tuple[KvSeqId, ...] = (seq,)
                rids: tuple[RequestId, ...] = (job.request_id,)
                kv_arg: list[KvSeqId | None] = [seq]
                with self._lock:
                    if ctx.first_job_at is None:
                        ctx.first_job_at = self._clock()
                        self._metrics.queue_time.labels(self.alias).observe(ctx.first_job_at - ctx.arrived)
            else:
                batch = job.batch
                graph = batch.profile.graph
                b = batch.profile.compiled_batch
                with self._lock:
                    seq_list = [self._lane_seq.get(lane) for lane in batch.kv_lanes]
                if any(s is None for s in seq_list):
                    raise _LaunchFailed("a decode lane has no runtime KV sequence")
                seqs = tuple(s for s in seq_list if s is not None)
                for i, s in enumerate(seqs):
                    pos = rt.kv.append(s, 1)
                    appended.append(s)
                    if pos != batch.positions[i]:  # 000 §9.2 rule 4
                        raise _LaunchFailed(
                            f"lane {batch.kv_lanes[i]}: KV position {pos} != scheduled position {batch.positions[i]}"
                        )
                inputs, outputs = rt.alloc_inputs(graph, b), rt.alloc_outputs(graph, b)
                inputs.write("tokens", np.array(batch.token_ids, dtype=np.int32).reshape(b, 1))
                inputs.write("positions", np.array(batch.positions, dtype=np.int32))
                if b > 1:
                    inputs.write("lane_valid", np.array(batch.lane_valid, dtype=np.uint8))
                kv_arg = list(seqs) + [None] * (b - len(seqs))
                rids = batch.request_ids
                self._metrics.batch_fill.labels(self.alias).observe(batch.fill_ratio)
            engine, banked = self._choose_engine(job, inputs, outputs, seqs, tuple(rids))
            rt_job = self._submit_with_backoff(rt, graph, inputs, outputs, kv_arg, job.generation, engine)
        except SlotConflict as exc:  # 000 §14: the two ping/pong jobs would share state
            with self._lock:
                self._apply(self._monitor.crosstalk(f"at submit: {exc}"))
            self._abort_launch(rt, job, appended, inputs, outputs, JobStatus.FAILED, f"refused: {exc}")
            return
        except _LaunchFailed as exc:
            self._abort_launch(rt, job, appended, inputs, outputs, JobStatus.FAILED, str(exc))
            return
        except DeviceBusy as exc:
            self._abort_launch(
                rt, job, appended, inputs, outputs, JobStatus.FAILED, f"device busy after {BUSY_RETRIES} retries: {exc}"
            )
            return
        except RuntimeLayerError as exc:
            status = JobStatus.FAULT if exc.status in {int(s) for s in FAULT_STATUSES} else JobStatus.FAILED
            self._metrics.device_errors.labels(self.alias, type(exc).__name__).inc()
            self._abort_launch(rt, job, appended, inputs, outputs, status, f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # a bug while preparing: the job must still complete, or its request hangs
            log.exception("worker %s: preparing job %s failed", self.alias, job.job_id)
            self._abort_launch(rt, job, appended, inputs, outputs, JobStatus.FAILED, f"internal error: {exc}")
            return
        with self._lock:
            self._inflight[job.job_id] = _Inflight(
                job, rt_job, inputs, outputs, seqs, tuple(rids), self._clock(), graph, engine, inline, banked
            )
            if not inline:
                self._unclaimed.append(job.job_id)
                self._completion_cv.notify()

    def _choose_engine(
        self,
        job: PrefillJob | DecodeJob,
        inputs: HostBuffer,
        outputs: HostBuffer,
        seqs: tuple[KvSeqId, ...],
        rids: tuple[RequestId, ...],
    ) -> tuple[JobEngine, bool]:
        """(engine, banked) for a new job: the free ping/pong bank in ping/pong (nothing shared with the
        other, else SlotConflict), else ``auto`` (``ping`` with ``fixed_engine``). The mode in use now
        decides: a mode change affects only jobs not yet submitted (000 §14)."""
        with self._lock:
            if self._mode is not ExecutorMode.PINGPONG:
                return (JobEngine.PING if self.options.fixed_engine else JobEngine.AUTO), False
            bank = self._slots.claim(job.job_id, inputs, outputs, seqs, rids)
            if bank is None:
                raise _LaunchFailed(f"both ping/pong banks hold a job ({self._slots.holders()})")
        return bank, True

    def _submit_with_backoff(
        self,
        rt: Runtime,
        graph: str,
        inputs: HostBuffer,
        outputs: HostBuffer,
        kv: list[KvSeqId | None],
        generation: GenerationId,
        engine: JobEngine,
    ) -> RtJob:
        delay = 0.001
        for attempt in range(BUSY_RETRIES + 1):
            try:
                rt_job = rt.submit(graph, inputs, outputs, engine, kv=kv, generation=RtGenerationId(int(generation)))
            except DeviceBusy:
                self._metrics.submit_busy.labels(self.alias).inc()
                with self._lock:  # 000 §14: consecutive DeviceBusy downgrade ping/pong
                    self._apply(self._monitor.submit_busy())
                if attempt == BUSY_RETRIES:
                    raise
                time.sleep(delay)
                delay *= 2
            else:
                with self._lock:
                    self._monitor.submit_ok()
                return rt_job
        raise AssertionError("unreachable")

    def _abort_launch(
        self,
        rt: Runtime,
        job: PrefillJob | DecodeJob,
        appended: list[KvSeqId],
        inputs: HostBuffer | None,
        outputs: HostBuffer | None,
        status: JobStatus,
        detail: str,
    ) -> None:
        log.warning("worker %s: job %s not submitted: %s", self.alias, job.job_id, detail)
        if status is JobStatus.FAILED:
            for s in appended:
                with contextlib.suppress(RuntimeLayerError):
                    rt.kv.rollback(s)
        for buf in (inputs, outputs):
            if buf is not None:
                with contextlib.suppress(RuntimeLayerError):
                    rt.release_buffer(buf)
        self._metrics.jobs.labels(self.alias, _graph_kind(job), "not_submitted").inc()
        with self._lock:
            self._slots.release(job.job_id)
        self._complete(JobOutcome(job.job_id, job.generation, status, detail=detail))

    # ------------------------------------------------------------------ completion

    def _time_out(self, inf: _Inflight) -> None:
        """001 §11.3: Wait timeout -> stop new submits, lanes Unknown, quarantine (never free its buffers).
        The job keeps its ping/pong bank until the runtime gives its buffers back."""
        with self._lock:
            if self._inflight.pop(inf.core.job_id, None) is None:
                return
            self._quarantine[inf.core.job_id] = inf
            self._apply(self._monitor.job_timed_out())
        self._metrics.device_errors.labels(self.alias, "Timeout").inc()
        self._metrics.jobs.labels(self.alias, _graph_kind(inf.core), "timeout").inc()
        self._complete(
            JobOutcome(
                inf.core.job_id,
                inf.core.generation,
                JobStatus.TIMEOUT,
                detail=f"no completion after {self.options.job_timeout_s:.1f}s",
            ),
            runtime_status=RuntimeStatus.TIMEOUT,
        )

    def _finish_job(self, rt: Runtime, inf: _Inflight) -> None:
        with self._lock:
            if self._inflight.pop(inf.core.job_id, None) is None:
                return  # retired while we waited: it is quarantined, the sweep releases it
        res = rt.query(inf.rt_job)
        elapsed = self._clock() - inf.submitted
        self._metrics.job_seconds.labels(self.alias, inf.graph).observe(elapsed)
        runtime_status: RuntimeStatus | None = None
        verdict: Downgrade | None = None
        anomaly = _status_anomaly(inf, res)
        if anomaly is not None:  # the runtime's answer contradicts itself: trust nothing it wrote
            outcome = JobOutcome(
                inf.core.job_id, inf.core.generation, JobStatus.FAULT, detail=f"status anomaly: {anomaly}"
            )
            with self._lock:
                verdict = self._monitor.status_anomaly(anomaly)
            self._metrics.jobs.labels(self.alias, _graph_kind(inf.core), "bad_output").inc()
        elif res.ok:
            outcome, crosstalk = self._read_output(inf)
            if crosstalk is not None:
                with self._lock:
                    verdict = self._monitor.crosstalk(crosstalk)
            if outcome.status is JobStatus.OK:
                for s in inf.seqs:
                    rt.kv.commit(s)
            self._metrics.jobs.labels(
                self.alias, _graph_kind(inf.core), "ok" if outcome.status is JobStatus.OK else "bad_output"
            ).inc()
        else:
            runtime_status = (
                RuntimeStatus(res.status) if res.status in RuntimeStatus._value2member_map_ else RuntimeStatus.INTERNAL
            )
            self._metrics.device_errors.labels(self.alias, runtime_status.name).inc()
            self._metrics.jobs.labels(self.alias, _graph_kind(inf.core), "failed").inc()
            status = (
                JobStatus.FAULT
                if runtime_status in FAULT_STATUSES or runtime_status is RuntimeStatus.JOB_ABORTED
                else JobStatus.FAILED
            )
            if status is JobStatus.FAILED:
                for s in inf.seqs:
                    with contextlib.suppress(RuntimeLayerError):
                        rt.kv.rollback(s)
            outcome = JobOutcome(
                inf.core.job_id,
                inf.core.generation,
                status,
                detail=f"{runtime_status.name}: {res.detail or ''}".strip(),
            )
        self._try_release(rt, inf)
        with self._lock:
            self._slots.release(inf.core.job_id)
            self._apply(verdict)
            if outcome.status is JobStatus.OK:
                self._monitor.job_completed()
        self._complete(outcome, runtime_status=runtime_status)

    def _read_output(self, inf: _Inflight) -> tuple[JobOutcome, str | None]:
        """Sample a succeeded job's logits after the crosstalk checks (000 §14). Returns (outcome, crosstalk detail)."""
        job = inf.core.job_id
        try:
            logits = inf.outputs.read("logits")
        except RuntimeLayerError as exc:  # e.g. the buffer is still lent to another job: never read it
            detail = f"output of job {job} unreadable: {exc}"
            return JobOutcome(job, inf.core.generation, JobStatus.FAULT, detail=detail), detail
        if not np.all(np.isfinite(logits)):
            detail = f"corrupted output: non-finite logits in job {job}"
            return JobOutcome(job, inf.core.generation, JobStatus.FAULT, detail=detail), detail
        outcome = self._sample(inf, logits)
        if inf.banked:
            with self._lock:
                problem = self._slots.check_completion(job, inf.engine, tuple(r.request_id for r in outcome.results))
            if problem is not None:
                return JobOutcome(job, inf.core.generation, JobStatus.FAULT, detail=f"crosstalk: {problem}"), problem
        return outcome, None

    def _sample(self, inf: _Inflight, logits: np.ndarray) -> JobOutcome:
        results = []
        with self._lock:
            for lane, rid in enumerate(inf.request_ids):
                ctx = self._requests.get(rid)
                sampling = ctx.gen.sampling if ctx else SamplingParams(temperature=0.0)
                rng = ctx.rng if ctx else np.random.default_rng(0)
                token = sample_token(logits[lane], sampling, rng)
                stop = (not (ctx and ctx.gen.ignore_eos)) and token == self.codec.eos_token_id
                results.append(LaneResult(rid, int(token), stop=stop))
        return JobOutcome(inf.core.job_id, inf.core.generation, JobStatus.OK, tuple(results))

    def _complete(self, outcome: JobOutcome, runtime_status: RuntimeStatus | None = None) -> None:
        now = self._clock()
        with self._lock:
            self._sched.update_from_output(outcome, now)
            # Tokens of this outcome are tagged with the job's generation (TokenEvent.generation, 001 §13.1).
            self._pump(now, runtime_status, generation=outcome.generation)
            self._start_deferred_recovery()

    def _try_release(self, rt: Runtime, inf: _Inflight) -> bool:
        ok = True
        for buf in (inf.inputs, inf.outputs):
            try:
                rt.release_buffer(buf)
            except RuntimeLayerError:
                ok = False  # still owned by a job (or an unknown DMA state): keep it quarantined
        return ok

    def _sweep_quarantine(self) -> None:
        rt = self._rt
        if rt is None or not self._quarantine:
            return
        with self._lock:
            items = list(self._quarantine.items())
        for job_id, inf in items:
            res = rt.query(inf.rt_job)
            if res.state.terminal and self._try_release(rt, inf):
                with self._lock:
                    self._quarantine.pop(job_id, None)
                    self._slots.release(job_id)
                # Its late completion is stale for the scheduler (000 §4 rule 4).
                self._complete(JobOutcome(job_id, inf.core.generation, JobStatus.FAILED, detail="late completion"))

    # ------------------------------------------------------------------ events -> streams

    def _pump(
        self, now: float, runtime_status: RuntimeStatus | None = None, *, generation: GenerationId | None = None
    ) -> None:
        """Deliver scheduler events. Called with the worker lock held. ``generation``: the job generation
        of the outcome being applied (tokens are only ever emitted from one)."""
        while True:
            events = self._sched.drain_events()
            if not events:
                return
            for ev in events:
                if isinstance(ev, TokenEmitted):
                    self._on_token(ev, now, self._sched.generation if generation is None else generation)
                elif isinstance(ev, TerminalEvent):
                    self._on_terminal(ev, now)
                elif isinstance(ev, LaneReleased):
                    seq = self._lane_seq.pop(ev.lane, None)
                    if seq is not None and self._rt is not None:
                        try:
                            self._rt.kv.free(seq)
                        except RuntimeLayerError as exc:
                            log.warning("worker %s: freeing KV sequence %s failed: %s", self.alias, seq, exc)
                    self._sched.confirm_kv_released(ev.lane)
                elif isinstance(ev, StaleCompletion):
                    self._metrics.stale.labels(self.alias).inc()
                    log.info("worker %s: stale completion of job %s dropped (%s)", self.alias, ev.job_id, ev.reason)
                elif isinstance(ev, RecoveryNeeded):
                    self._apply(self._monitor.recovery_needed(f"{ev.status.value}: {ev.detail}"))
                    if not self._recovery_pending:
                        self._recovery_pending = True
                        self._serving = False
                        req = RecoveryRequest(self.alias, ev.status, ev.detail, runtime_status)
                        if self._inflight:
                            # 000 §14: submitted jobs drain; the reset waits until they completed or timed out.
                            self._deferred_recovery = req
                            log.warning(
                                "worker %s: recovery (%s) waits for %d job(s) in flight to drain",
                                self.alias,
                                ev.status.value,
                                len(self._inflight),
                            )
                        else:
                            self._start_recovery(req)

    def _start_recovery(self, req: RecoveryRequest) -> None:
        threading.Thread(target=self._on_recovery, args=(req,), name=f"recover-{self.alias}", daemon=True).start()

    def _start_deferred_recovery(self) -> None:
        """Called with the lock held after every completion: the last drained job releases the recovery."""
        if self._deferred_recovery is not None and not self._inflight:
            req, self._deferred_recovery = self._deferred_recovery, None
            log.info("worker %s: jobs in flight drained; recovery starts", self.alias)
            self._start_recovery(req)

    def _on_token(self, ev: TokenEmitted, now: float, generation: GenerationId) -> None:
        ctx = self._requests.get(ev.request_id)
        if ctx is None:
            return
        ctx.tokens = ev.index + 1
        if ctx.first_token_at is None:
            ctx.first_token_at = now
            self._metrics.ttft.labels(self.alias).observe(now - ctx.arrived)
        elif ctx.last_token_at is not None:
            self._metrics.tpot.labels(self.alias).observe(now - ctx.last_token_at)
            self._apply(self._monitor.latency(now - ctx.last_token_at))  # 000 §14 P99 regression
        ctx.last_token_at = now
        self._metrics.tokens.labels(self.alias).inc()
        self._metrics.tenant_tokens.labels(self.alias, ctx.gen.tenant).inc()
        event = TokenEvent(
            ev.token_id, prompt_tokens=len(ctx.gen.prompt_ids), completion_tokens=ctx.tokens, generation=int(generation)
        )
        ctx.stream.post_token(event)
        if self._stale_probe is not None:
            self._stale_probe_step(ctx.stream, event)

    # ------------------------------------------------------------------ executor mode (000 §14)

    @property
    def executor_mode(self) -> ExecutorMode:
        return self._mode

    def downgrades(self) -> list[DowngradeRecord]:
        with self._lock:
            return list(self._downgrades)

    def set_executor_mode(self, mode: ExecutorMode) -> dict[str, Any]:
        """Operator action: use ``mode`` for jobs not yet submitted; jobs in flight drain.

        The only way back to ping/pong after a downgrade (000 §14: never automatic). Refused
        (``ok: False``) when the configuration does not allow it: ``executor.max_inflight`` is the
        ceiling, and ping/pong cannot use a fixed engine.
        """
        with self._lock:
            ceiling = self._sched.settings.budget.max_inflight_jobs
            if mode.max_inflight > ceiling:
                return {
                    **self._status_locked(),
                    "ok": False,
                    "detail": f"{mode.value} needs executor.max_inflight {mode.max_inflight}; the configuration allows {ceiling}",
                }
            if mode is ExecutorMode.PINGPONG and self.options.fixed_engine:
                return {
                    **self._status_locked(),
                    "ok": False,
                    "detail": "executor.fixed_engine is set: ping/pong needs both banks",
                }
            previous = self._mode
            self._change_mode(mode, None, "set by an operator")
            self._operator_changes.append({"at": time.time(), "from": previous.value, "to": mode.value})
            del self._operator_changes[:-MAX_DOWNGRADE_RECORDS]
            status = {**self._status_locked(), "ok": True, "previous_mode": previous.value}
        log.info(
            "executor mode of %s set by an operator: %s -> %s (jobs in flight drain)",
            self.alias,
            previous.value,
            mode.value,
        )
        self._wake.set()
        return status

    def executor_status(self) -> dict[str, Any]:
        with self._lock:
            return self._status_locked()

    def _status_locked(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "mode": self._mode.value,
            "configured_mode": self.options.mode.value,
            "max_inflight": self._sched.inflight_limit,
            "configured_max_inflight": self._sched.settings.budget.max_inflight_jobs,
            "inflight_jobs": len(self._inflight),
            "banks": self._slots.holders() if self._mode is ExecutorMode.PINGPONG or self._slots.busy() else None,
            "downgrades": [d.as_dict() for d in self._downgrades],
            "operator_changes": list(self._operator_changes),
            "monitor": self._monitor.state(),
        }

    def _apply(self, verdict: Downgrade | None) -> None:
        """Act on a monitor verdict (lock held): leave ping/pong for the configured one-in-flight mode."""
        if verdict is None or self._mode is not ExecutorMode.PINGPONG:
            return
        self._change_mode(self.options.downgrade.to, verdict.reason, verdict.detail)

    def _change_mode(self, mode: ExecutorMode, reason: DowngradeReason | None, detail: str) -> None:
        """Lock held. Only new jobs see the new mode: the scheduler hands out no job until fewer than
        the new limit are in flight, so the ping/pong jobs already submitted drain first (000 §14).
        ``reason`` None: an operator's choice, not a downgrade (not counted in the metric)."""
        previous = self._mode
        self._mode = mode
        self._sched.set_inflight_limit(mode.max_inflight)
        self._monitor.set_mode(mode)
        if reason is not None and previous is ExecutorMode.PINGPONG and mode is not ExecutorMode.PINGPONG:
            rec = DowngradeRecord(time.time(), previous, mode, reason, detail, len(self._inflight))
            self._downgrades.append(rec)
            del self._downgrades[:-MAX_DOWNGRADE_RECORDS]
            self._metrics.downgrades.labels(self.alias, reason.value).inc()
            log.warning(
                "executor downgrade: model=%s from=%s to=%s reason=%s draining_jobs=%d detail=%s",
                self.alias,
                previous.value,
                mode.value,
                reason.value,
                rec.draining_jobs,
                detail,
            )
        self._completion_cv.notify_all()

    # ------------------------------------------------------------------ diagnostics (calctl soak --inject)

    def arm_stale_redelivery(self) -> None:
        """DIAGNOSTIC ONLY, never used in serving: deliberately break the generation rule once.

        ``calctl soak --inject stale-completion`` arms it to prove that the soak's checker catches a
        completion from a retired generation (000 §4 rule 4, 001 §13.1). Once armed, the worker remembers
        the last token it delivered; at the first token of a *newer* generation (after a reload or a
        recovery), it delivers the remembered token, still tagged with its retired generation, to that
        new request as well. Then it disarms itself.
        """
        with self._lock:
            self._stale_probe = _StaleProbe()

    def _stale_probe_step(self, stream: EngineStream, event: TokenEvent) -> None:
        probe = self._stale_probe
        assert probe is not None
        old = probe.last
        if (
            old is not None
            and old.generation is not None
            and event.generation is not None
            and old.generation < event.generation
        ):
            log.warning(
                "worker %s: DIAGNOSTIC stale-completion injection: re-delivering a token of retired generation "
                "%s to request %s (generation %s)",
                self.alias,
                old.generation,
                stream.request_id,
                event.generation,
            )
            stream.post_token(old)
            self._stale_probe = None
            return
        probe.last = event

    def _on_terminal(self, ev: TerminalEvent, now: float) -> None:
        ctx = self._requests.pop(ev.request_id, None)
        outcome = ev.reason.value
        if ctx is not None and ctx.end_reason is FinishReason.STOP and ev.reason is CoreFinish.CANCELLED:
            outcome = "stop"
        self._metrics.requests.labels(self.alias, outcome).inc()
        if ctx is None:
            return
        self._metrics.e2e.labels(self.alias).observe(now - ctx.arrived)
        prompt_n, completion_n = len(ctx.gen.prompt_ids), ctx.tokens
        if ev.http_status is not None and ctx.tokens == 0:
            code = {400: RejectCode.INVALID, 429: RejectCode.CAPACITY}.get(ev.http_status, RejectCode.UNAVAILABLE)
            if ev.reason is CoreFinish.DEADLINE:
                code = RejectCode.DEADLINE
            if ev.reason is CoreFinish.CANCELLED:
                ctx.stream.post_end(
                    TokenEvent(None, FinishReason.CANCELLED, prompt_tokens=prompt_n, completion_tokens=completion_n)
                )
                return
            ctx.stream.post_rejected(
                EngineRejection(code, f"{self.alias}: {ev.detail}", retry_after_s=ev.retry_after_s)
            )
            return
        finish = {
            CoreFinish.STOP: FinishReason.STOP,
            CoreFinish.LENGTH: FinishReason.LENGTH,
            CoreFinish.CANCELLED: ctx.end_reason or FinishReason.CANCELLED,
        }.get(ev.reason, FinishReason.ERROR)
        error = None
        if finish is FinishReason.ERROR:
            error = f"{self.alias}: {ev.reason.value}: {ev.detail}"
        ctx.stream.post_end(
            TokenEvent(None, finish, error=error, prompt_tokens=prompt_n, completion_tokens=completion_n)
        )


class _LaunchFailed(Exception):
    pass


@dataclass
class _StaleProbe:
    """State of the stale-completion diagnostic (:meth:`ModelWorker.arm_stale_redelivery`)."""

    last: TokenEvent | None = None


def _status_anomaly(inf: _Inflight, res: JobResult) -> str | None:
    """What is self-contradictory in the runtime's answer about a job that Wait reported done (000 §14)."""
    if res.job.id != inf.rt_job.id:
        return f"query about job {inf.rt_job.id} answered for job {res.job.id}"
    if not res.state.terminal:
        return f"job {res.job.id} was reported done but is {res.state.value}"
    if res.ok and res.status != RuntimeStatus.OK:
        return f"job {res.job.id} succeeded with status {res.status.name}"
    if res.start_ns is not None and res.end_ns is not None and res.end_ns < res.start_ns:
        return f"job {res.job.id} ended before it started"
    return None


def _graph_kind(job: PrefillJob | DecodeJob) -> str:
    return "prefill" if isinstance(job, PrefillJob) else "decode"


def _rejection(result: AdmissionResult, alias: str) -> EngineRejection:
    code = {
        Verdict.REJECT_INVALID: RejectCode.INVALID,
        Verdict.REJECT_CAPACITY: RejectCode.CAPACITY,
        Verdict.REJECT_UNAVAILABLE: RejectCode.UNAVAILABLE,
    }.get(result.verdict, RejectCode.UNAVAILABLE)
    param = "max_tokens" if code is RejectCode.INVALID and "max_tokens" in result.reason else None
    return EngineRejection(code, f"{alias}: {result.reason}", param=param, retry_after_s=result.retry_after_s)


def sample_token(logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> int:
    """Greedy at temperature 0; otherwise temperature + nucleus (top-p) sampling with the request's RNG."""
    if sampling.greedy:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / sampling.temperature
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-p)
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, sampling.top_p) + 1)]
        mask = np.zeros_like(p)
        mask[keep] = p[keep]
        p = mask / mask.sum()
    return int(rng.choice(len(p), p=p))


__all__ = ["ModelWorker", "RecoveryRequest", "WorkerOptions", "core_admission", "sample_token"]
