"""ModelWorker: one alias, one chip, one submit/completion loop (001 §4, §10.2; 000 §3).

The worker owns its scheduler (``calctl.serving.core.Scheduler``), the map from
the scheduler's KV lanes to runtime KV sequences, the host buffers of its jobs
in flight, and the streams of its requests. Its thread runs the vLLM-style
step::

    schedule(now) -> submit jobs -> wait_any -> update_from_output -> events

Rules kept here (001 §10.3):

* the worker lock guards scheduler state only and is never held while waiting
  on the device; a worker never touches another worker's lock;
* a job's buffers are exclusively the job's from submit to completion; a
  timed-out job's buffers are quarantined until the runtime gives them back;
* KV commit only after device *and* output success (non-finite logits are a
  fault), rollback after a clean failure, Unknown after a timeout or fault;
* a completion from a retired generation is dropped (StaleCompletion) but its
  buffers are still released (000 §4 rule 4).

Recovery and lifecycle decisions belong to the DeviceSupervisor; the worker
only reports ``RecoveryNeeded`` and follows instructions.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from calctl.package.model import Model
from calctl.runtime.buffers import HostBuffer
from calctl.runtime.errors import DeviceBusy, RuntimeLayerError, RuntimeStatus
from calctl.runtime.interface import Runtime
from calctl.runtime.types import Engine as JobEngine
from calctl.runtime.types import GenerationId as RtGenerationId
from calctl.runtime.types import Job as RtJob
from calctl.runtime.types import KvSeqId
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
from calctl.serving.engine.metrics import EngineMetrics, ModelSnapshot
from calctl.serving.engine.streams import EngineStream
from calctl.serving.protocol import EngineRejection, FinishReason, GenerationRequest, RejectCode, SamplingParams, TokenEvent
from calctl.serving.text import TextCodec

log = logging.getLogger("calctl.serve")
Clock = Callable[[], float]

#: 001 §11.3 "DeviceBusy -> bounded backoff": at most this many retries, doubling from 1 ms.
BUSY_RETRIES = 6
FAULT_STATUSES = frozenset({RuntimeStatus.CCU_EXCEPTION, RuntimeStatus.UNKNOWN_DMA_STATE, RuntimeStatus.DEVICE_LOST,
                            RuntimeStatus.TIMEOUT, RuntimeStatus.INTERNAL})


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


@dataclass
class RecoveryRequest:
    alias: str
    status: JobStatus
    detail: str
    runtime_status: RuntimeStatus | None


@dataclass
class WorkerOptions:
    job_timeout_s: float = 30.0
    engine: JobEngine = JobEngine.AUTO
    poll_s: float = 0.02


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
        self._thread = threading.Thread(target=self._run, name=f"worker-{alias}", daemon=True)
        self._thread.start()

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
            alias=self.alias, state=self._display_state.value, generation=self.generation if self._serving else None,
            queues=queues, waiting_requests=st.waiting_requests, waiting_prompt_tokens=st.waiting_prompt_tokens,
            kv_lanes={k.value: v for k, v in st.kv_by_state.items()}, kv_reserved_tokens=st.kv_reserved_tokens,
            inflight_jobs=st.inflight_jobs, quarantined_jobs=st.quarantined_jobs, executor_mode="sync_inflight1",
        )

    # ------------------------------------------------------------------ API side

    def submit(self, req: GenerationRequest, stream: EngineStream) -> None:
        """Admission is decided here, atomically, before the first byte (000 §5.2). Raises EngineRejection."""
        rid = RequestId(req.request_id)
        if not req.prompt_ids:
            raise EngineRejection(RejectCode.INVALID, "the prompt is empty: at least one token is needed", param="prompt")
        if self._reject_all_as_unavailable:
            raise EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} is being reloaded; retry shortly",
                                  retry_after_s=1.0)
        now = self._clock()
        with self._lock:
            ticket = self._sched.arrive(rid, TenantId(req.tenant), now)
            if isinstance(ticket, AdmissionResult):
                self._count_verdict(ticket)
                raise _rejection(ticket, self.alias)
            seed = req.sampling.seed
            self._requests[rid] = _Request(req, stream, now, np.random.default_rng(seed))
            result = self._sched.submit(ticket, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens,
                                        deadline_s=req.timeout_s, now=now)
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
            try:
                rt.kv.free(seq)
            except RuntimeLayerError:
                pass  # the reset already dropped it
        for job_id, inf in quarantined:
            if self._try_release(rt, inf):
                with self._lock:
                    self._quarantine.pop(job_id, None)

    def detach(self) -> None:
        with self._lock:
            self._serving = False
            self._rt = None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

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
        jobs: tuple[PrefillJob | DecodeJob, ...] = ()
        wake_at: float | None = None
        with self._lock:
            now = self._clock()
            # schedule() also expires deadlines and promotes waiters while the model loads; it hands
            # out jobs only in Ready/Draining and not while halted for recovery.
            out = self._sched.schedule(now)
            jobs, wake_at = out.jobs, out.wake_at
            serving = self._serving and self._rt is not None
            self._pump(now)
        if jobs and not serving:  # defensive: never submit outside a published generation
            for job in jobs:
                self._complete(JobOutcome(job.job_id, job.generation, JobStatus.FAILED, detail="no generation is being served"))
            jobs = ()
        for job in jobs:
            self._launch(job)
        if self._inflight:
            self._reap()
        else:
            timeout = self.options.poll_s if wake_at is None else max(0.0, min(self.options.poll_s, wake_at - self._clock()))
            self._wake.wait(timeout)
            self._wake.clear()
        self._sweep_quarantine()

    # ------------------------------------------------------------------ submit

    def _launch(self, job: PrefillJob | DecodeJob) -> None:
        rt = self._rt
        assert rt is not None
        appended: list[KvSeqId] = []
        inputs = outputs = None
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
                        raise _LaunchFailed(f"lane {batch.kv_lanes[i]}: KV position {pos} != scheduled position {batch.positions[i]}")
                inputs, outputs = rt.alloc_inputs(graph, b), rt.alloc_outputs(graph, b)
                inputs.write("tokens", np.array(batch.token_ids, dtype=np.int32).reshape(b, 1))
                inputs.write("positions", np.array(batch.positions, dtype=np.int32))
                if b > 1:
                    inputs.write("lane_valid", np.array(batch.lane_valid, dtype=np.uint8))
                kv_arg = list(seqs) + [None] * (b - len(seqs))
                rids = batch.request_ids
                self._metrics.batch_fill.labels(self.alias).observe(batch.fill_ratio)
            rt_job = self._submit_with_backoff(rt, graph, inputs, outputs, kv_arg, job.generation)
        except _LaunchFailed as exc:
            self._abort_launch(rt, job, appended, inputs, outputs, JobStatus.FAILED, str(exc))
            return
        except DeviceBusy as exc:
            self._abort_launch(rt, job, appended, inputs, outputs, JobStatus.FAILED, f"device busy after {BUSY_RETRIES} retries: {exc}")
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
            self._inflight[job.job_id] = _Inflight(job, rt_job, inputs, outputs, seqs, tuple(rids), self._clock(), graph)

    def _submit_with_backoff(self, rt: Runtime, graph: str, inputs: HostBuffer, outputs: HostBuffer,
                             kv: list[KvSeqId | None], generation: GenerationId) -> RtJob:
        delay = 0.001
        for attempt in range(BUSY_RETRIES + 1):
            try:
                return rt.submit(graph, inputs, outputs, self.options.engine, kv=kv, generation=RtGenerationId(int(generation)))
            except DeviceBusy:
                self._metrics.submit_busy.labels(self.alias).inc()
                if attempt == BUSY_RETRIES:
                    raise
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _abort_launch(self, rt: Runtime, job: PrefillJob | DecodeJob, appended: list[KvSeqId], inputs: HostBuffer | None,
                      outputs: HostBuffer | None, status: JobStatus, detail: str) -> None:
        log.warning("worker %s: job %s not submitted: %s", self.alias, job.job_id, detail)
        if status is JobStatus.FAILED:
            for s in appended:
                try:
                    rt.kv.rollback(s)
                except RuntimeLayerError:
                    pass
        for buf in (inputs, outputs):
            if buf is not None:
                try:
                    rt.release_buffer(buf)
                except RuntimeLayerError:
                    pass
        self._metrics.jobs.labels(self.alias, _graph_kind(job), "not_submitted").inc()
        self._complete(JobOutcome(job.job_id, job.generation, status, detail=detail))

    # ------------------------------------------------------------------ completion

    def _reap(self) -> None:
        rt = self._rt
        if rt is None:
            return
        with self._lock:
            pending = list(self._inflight.values())
        try:
            done = rt.wait_any([p.rt_job for p in pending], timeout=self.options.poll_s)
        except RuntimeLayerError as exc:
            log.error("worker %s: wait_any failed: %s", self.alias, exc)
            done = []
        done_ids = {j.id for j in done}
        now = self._clock()
        for inf in pending:
            if inf.rt_job.id in done_ids:
                self._finish_job(rt, inf)
            elif now - inf.submitted > self.options.job_timeout_s:
                # 001 §11.3: Wait timeout -> stop new submits, lanes Unknown, quarantine (never free its buffers).
                self._metrics.device_errors.labels(self.alias, "Timeout").inc()
                self._metrics.jobs.labels(self.alias, _graph_kind(inf.core), "timeout").inc()
                with self._lock:
                    self._inflight.pop(inf.core.job_id, None)
                    self._quarantine[inf.core.job_id] = inf
                self._complete(JobOutcome(inf.core.job_id, inf.core.generation, JobStatus.TIMEOUT,
                                          detail=f"no completion after {self.options.job_timeout_s:.1f}s",
                                          ), runtime_status=RuntimeStatus.TIMEOUT)

    def _finish_job(self, rt: Runtime, inf: _Inflight) -> None:
        res = rt.query(inf.rt_job)
        with self._lock:
            self._inflight.pop(inf.core.job_id, None)
        elapsed = self._clock() - inf.submitted
        self._metrics.job_seconds.labels(self.alias, inf.graph).observe(elapsed)
        runtime_status: RuntimeStatus | None = None
        if res.ok:
            try:
                logits = inf.outputs.read("logits")
            except RuntimeLayerError as exc:
                outcome = JobOutcome(inf.core.job_id, inf.core.generation, JobStatus.FAULT, detail=f"output unreadable: {exc}")
            else:
                outcome = self._sample(inf, logits)
            if outcome.status is JobStatus.OK:
                for s in inf.seqs:
                    rt.kv.commit(s)
            self._metrics.jobs.labels(self.alias, _graph_kind(inf.core), "ok" if outcome.status is JobStatus.OK else "bad_output").inc()
        else:
            runtime_status = RuntimeStatus(res.status) if res.status in RuntimeStatus._value2member_map_ else RuntimeStatus.INTERNAL
            self._metrics.device_errors.labels(self.alias, runtime_status.name).inc()
            self._metrics.jobs.labels(self.alias, _graph_kind(inf.core), "failed").inc()
            status = JobStatus.FAULT if runtime_status in FAULT_STATUSES or runtime_status is RuntimeStatus.JOB_ABORTED else JobStatus.FAILED
            if status is JobStatus.FAILED:
                for s in inf.seqs:
                    try:
                        rt.kv.rollback(s)
                    except RuntimeLayerError:
                        pass
            outcome = JobOutcome(inf.core.job_id, inf.core.generation, status, detail=f"{runtime_status.name}: {res.detail or ''}".strip())
        self._try_release(rt, inf)
        self._complete(outcome, runtime_status=runtime_status)

    def _sample(self, inf: _Inflight, logits: np.ndarray) -> JobOutcome:
        if not np.all(np.isfinite(logits)):
            return JobOutcome(inf.core.job_id, inf.core.generation, JobStatus.FAULT, detail="corrupted output: non-finite logits")
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
            self._pump(now, runtime_status)

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
                # Its late completion is stale for the scheduler (000 §4 rule 4).
                self._complete(JobOutcome(job_id, inf.core.generation, JobStatus.FAILED, detail="late completion"))

    # ------------------------------------------------------------------ events -> streams

    def _pump(self, now: float, runtime_status: RuntimeStatus | None = None) -> None:
        """Deliver scheduler events. Called with the worker lock held."""
        while True:
            events = self._sched.drain_events()
            if not events:
                return
            for ev in events:
                if isinstance(ev, TokenEmitted):
                    self._on_token(ev, now)
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
                    if not self._recovery_pending:
                        self._recovery_pending = True
                        self._serving = False
                        req = RecoveryRequest(self.alias, ev.status, ev.detail, runtime_status)
                        threading.Thread(target=self._on_recovery, args=(req,), name=f"recover-{self.alias}", daemon=True).start()

    def _on_token(self, ev: TokenEmitted, now: float) -> None:
        ctx = self._requests.get(ev.request_id)
        if ctx is None:
            return
        ctx.tokens = ev.index + 1
        if ctx.first_token_at is None:
            ctx.first_token_at = now
            self._metrics.ttft.labels(self.alias).observe(now - ctx.arrived)
        elif ctx.last_token_at is not None:
            self._metrics.tpot.labels(self.alias).observe(now - ctx.last_token_at)
        ctx.last_token_at = now
        self._metrics.tokens.labels(self.alias).inc()
        self._metrics.tenant_tokens.labels(self.alias, ctx.gen.tenant).inc()
        ctx.stream.post_token(TokenEvent(ev.token_id, prompt_tokens=len(ctx.gen.prompt_ids), completion_tokens=ctx.tokens))

    def _on_terminal(self, ev: TerminalEvent, now: float) -> None:
        ctx = self._requests.pop(ev.request_id, None)
        outcome = ev.reason.value
        if ctx is not None and ctx.end_reason is FinishReason.STOP and ev.reason is CoreFinish.CANCELLED:
            outcome = "stop"
        self._metrics.requests.labels(self.alias, outcome).inc()
        if ctx is None:
            return
        self._metrics.e2e.labels(self.alias).observe(now - ctx.arrived)
        usage = dict(prompt_tokens=len(ctx.gen.prompt_ids), completion_tokens=ctx.tokens)
        if ev.http_status is not None and ctx.tokens == 0:
            code = {400: RejectCode.INVALID, 429: RejectCode.CAPACITY}.get(ev.http_status, RejectCode.UNAVAILABLE)
            if ev.reason is CoreFinish.DEADLINE:
                code = RejectCode.DEADLINE
            if ev.reason is CoreFinish.CANCELLED:
                ctx.stream.post_end(TokenEvent(None, FinishReason.CANCELLED, **usage))
                return
            ctx.stream.post_rejected(EngineRejection(code, f"{self.alias}: {ev.detail}", retry_after_s=ev.retry_after_s))
            return
        finish = {
            CoreFinish.STOP: FinishReason.STOP,
            CoreFinish.LENGTH: FinishReason.LENGTH,
            CoreFinish.CANCELLED: ctx.end_reason or FinishReason.CANCELLED,
        }.get(ev.reason, FinishReason.ERROR)
        error = None
        if finish is FinishReason.ERROR:
            error = f"{self.alias}: {ev.reason.value}: {ev.detail}"
        ctx.stream.post_end(TokenEvent(None, finish, error=error, **usage))


class _LaunchFailed(Exception):
    pass


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


__all__ = ["ModelWorker", "WorkerOptions", "RecoveryRequest", "sample_token", "core_admission"]
