"""EngineCore: one alias, one thread, the only caller of its scheduler (vLLM v1 ``EngineCore``; 001 §4, §10.2).

"Who changes a request's state": this thread, and nothing else. Every other
party only posts to its inbox:

* API threads and event loops post arrivals, cancels and stops (a stop string matched);
* the supervisor posts lifecycle commands (publish, retire, set state, forget device state,
  executor mode) and waits for each to be applied;
* the device executor's completion threads post "job done" / "job timed out".

Each step of the loop::

    drain the inbox -> schedule(now) -> launch the jobs -> (sync: wait inline)
      -> update_from_output for every finished job -> deliver events to the streams

Admission is decided on this thread too, and still before the first byte of
the response: the HTTP layer awaits :meth:`EngineStream.admitted`, which this
thread resolves, or fails with the 400/429/503 rejection (000 §5.2).

How a job's wait happens is the executor mode (000 §14, docs/executor.md):
``sync`` waits on this thread for the one job it submitted (between wait slices
it still drains the inbox, so admission and cancels go on); ``async`` and
``pingpong`` hand the wait to the executor's completion threads, with one job in
flight (``async``) or two on alternating banks (``pingpong``). The
:class:`~calctl.serving.engine.monitor.ExecutorMonitor` downgrades ping/pong to
one in flight when 000 §14's conditions fire; jobs already submitted drain.
Only an operator goes back (:meth:`EngineCore.set_executor_mode`).

A bug inside the loop (an exception no step expects) fails every request the
alias holds and the alias itself (Failed), logged once with its traceback; the
thread ends. It is never retried in a loop while requests hang.

Recovery and lifecycle decisions belong to the DeviceSupervisor: the core only
reports :class:`RecoveryRequest` (once the jobs still in flight have drained,
000 §14) and follows the commands it is sent.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from calctl.errors import ConfigError
from calctl.package.model import Model
from calctl.runtime.errors import RuntimeLayerError, RuntimeStatus
from calctl.runtime.interface import Runtime
from calctl.serving.config import DEFAULT_TENANT, DowngradePolicy, ExecutorMode
from calctl.serving.core.admission import AdmissionResult, ModelState, Verdict
from calctl.serving.core.ids import GenerationId, RequestId, TenantId
from calctl.serving.core.request import FinishReason as CoreFinish
from calctl.serving.core.request import RequestState, TerminalEvent
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
from calctl.serving.engine.device import DeviceExecutor, Finished, Inflight, JobDone, JobTimedOut
from calctl.serving.engine.metrics import EngineMetrics, ModelSnapshot, TenantSnapshot
from calctl.serving.engine.modes import DowngradeReason, DowngradeRecord
from calctl.serving.engine.monitor import Downgrade, ExecutorMonitor
from calctl.serving.engine.sampling import request_rng, sample_token
from calctl.serving.engine.streams import EngineStream
from calctl.serving.outcomes import ENDINGS, VERDICT_REJECTION, Ending, Outcome, public_before_output
from calctl.serving.protocol import EngineRejection, FinishReason, GenerationRequest, RejectCode, TokenEvent
from calctl.serving.records import ms
from calctl.serving.text import TextCodec

log = logging.getLogger("calctl.serve")
Clock = Callable[[], float]
T = TypeVar("T")

#: How often the core reads its chip's counters for the downgrade monitor (000 §14).
COUNTER_CHECK_S = 0.25
#: sync mode: the longest the core waits on the device before it looks at its inbox again.
INLINE_SLICE_S = 0.002
MAX_DOWNGRADE_RECORDS = 100


@dataclass
class RecoveryRequest:
    alias: str
    status: JobStatus
    detail: str
    runtime_status: RuntimeStatus | None
    # The generation the fault happened in: a recovery that republished the alias since (a board reset for
    # the other alias's fault of the same hang) already covered it (DeviceSupervisor.recover).
    generation: int | None = None


@dataclass
class WorkerOptions:
    """``mode``/``fixed_engine``/``downgrade`` come from the scheduler configuration's ``executor`` block
    (000 §15); ``chip_exclusive``: no other alias runs on this core's chip (its counters are ours)."""

    job_timeout_s: float = 30.0
    poll_s: float = 0.02
    mode: ExecutorMode = ExecutorMode.SYNC
    fixed_engine: bool = False
    downgrade: DowngradePolicy = field(default_factory=DowngradePolicy)
    chip_exclusive: bool = True


# -- inbox messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Arrive:
    request: GenerationRequest
    stream: EngineStream
    at: float


@dataclass(frozen=True)
class _Cancel:
    request_id: RequestId
    reason: str


@dataclass(frozen=True)
class _Stop:
    request_id: RequestId


@dataclass(frozen=True)
class _Command:
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]


_WAKE = object()  # stop() posts it so a blocked get() returns


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


@dataclass
class _StaleProbe:
    """State of the stale-completion diagnostic (:meth:`EngineCore.arm_stale_redelivery`)."""

    last: TokenEvent | None = None


class EngineCore:
    """The engine of one alias: its scheduler, its device executor, its streams, and the one thread over them."""

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
        if self.options.mode.max_inflight > settings.budget.max_inflight_jobs:
            raise ConfigError(
                f"{alias}: executor mode {self.options.mode.value} needs max_inflight "
                f"{self.options.mode.max_inflight}, the configuration allows {settings.budget.max_inflight_jobs}"
            )
        self._metrics = metrics
        self._on_recovery = on_recovery
        self._clock = clock
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._sched = Scheduler(settings, generation=GenerationId(0), model_state=ModelState.UNLOADED)
        self._mode = self.options.mode
        self._sched.set_inflight_limit(self._mode.max_inflight)
        self._monitor = ExecutorMonitor(self.options.downgrade, self._mode, chip_exclusive=self.options.chip_exclusive)
        self._exec = DeviceExecutor(
            alias,
            model,
            metrics,
            self._monitor,
            post=self._inbox.put,
            job_timeout_s=self.options.job_timeout_s,
            poll_s=self.options.poll_s,
            fixed_engine=self.options.fixed_engine,
            clock=clock,
        )
        self._requests: dict[RequestId, _Request] = {}
        # Request ids submitted and not yet terminal, written by submitters (add) and this thread (discard):
        # what drained() and cancel() read without waiting for the loop.
        self._known: set[str] = set()
        self._serving = False
        self._display_state = ModelState.UNLOADED
        self._reject_all_as_unavailable = False
        self._failed: str | None = None  # a bug ended the loop: why
        self._stopping = False
        self._recovery_pending = False
        self._deferred_recovery: RecoveryRequest | None = None  # waits for the jobs still in flight to drain
        self._stale_probe: _StaleProbe | None = None  # diagnostic only (arm_stale_redelivery)
        self._downgrades: list[DowngradeRecord] = []  # automatic only (000 §14)
        self._operator_changes: list[dict[str, Any]] = []
        self._next_counter_check = 0.0
        self._wake_at: float | None = None
        # (runtime status, job generation) of an outcome applied but not yet delivered (see _apply_outcome)
        self._pending: tuple[RuntimeStatus | None, GenerationId] | None = None
        self._inflight_n = 0
        self._quarantined_n = 0
        m = metrics
        self._m_ttft = m.ttft.labels(alias)
        self._m_tpot = m.tpot.labels(alias)
        self._m_tokens = m.tokens.labels(alias)
        self._m_e2e = m.e2e.labels(alias)
        self._m_queue = m.queue_time.labels(alias)
        self._m_prompt = m.prompt_tokens.labels(alias)
        self._m_tenant: dict[str, Any] = {}
        self._m_batch_wait = m.batch_wait.labels(alias)
        self._m_kv_free = m.kv_free.labels(alias)
        for q in ("short", "medium", "long"):  # every class shows, 0 until a request starves (000 §16)
            m.starvation.labels(alias, q)
        self._m_verdict = {v: m.admission.labels(alias, v.value) for v in Verdict}
        self._m_outcome = {o: m.requests.labels(alias, o.value) for o in Outcome}
        self._thread = threading.Thread(target=self._run, name=f"engine-{alias}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ reading (any thread)

    @property
    def state(self) -> ModelState:
        return self._display_state

    @property
    def generation(self) -> int:
        return int(self._sched.generation)

    @property
    def chips(self) -> tuple[int, ...]:
        return self.model.target_chips

    @property
    def context_limit(self) -> int:
        """The context this alias serves: the configured ``context_limit`` when it is lower than the package's."""
        return self._sched.settings.admission.context_limit  # immutable settings: safe from any thread

    @property
    def failed(self) -> str | None:
        """Why the loop ended on a bug, or None while it runs."""
        return self._failed

    def is_ready(self) -> bool:
        return self._display_state is ModelState.READY and self._serving and self._failed is None

    def live_requests(self) -> int:
        return len(self._known)

    def inflight(self) -> int:
        return self._inflight_n

    def quarantined(self) -> int:
        return self._quarantined_n

    def drained(self) -> bool:
        return not self._known and not self._inflight_n

    @property
    def executor_mode(self) -> ExecutorMode:
        return self._mode

    def downgrades(self) -> list[DowngradeRecord]:
        return list(self._downgrades)

    def snapshot(self) -> ModelSnapshot:
        st, extras = self._call(lambda: (self._sched.stats(), self._snapshot_extras()))
        oldest, lane_wait, kv_used, tenants = extras
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
            oldest_wait=oldest,
            lane_wait_s=lane_wait,
            kv_used_tokens=kv_used,
            tenants=tenants,
        )

    def _snapshot_extras(self) -> tuple[dict[str, float], float, int, list[TenantSnapshot]]:
        """000 §16 gauges computed on this thread at scrape time (one pass over the live requests, never
        per token): the oldest wait of each queue class, the longest wait for a KV lane, the KV tokens
        written, and the virtual lag and quota use of each configured tenant and of ``default`` (keyless requests,
        under the default policy): tenant labels come from configuration, never from requests."""
        now = self._clock()
        sched = self._sched
        classify = sched.prefill.thresholds.classify
        oldest = {"short": 0.0, "medium": 0.0, "long": 0.0, "decode": 0.0}
        lane_wait = 0.0
        for seq in sched.registry:
            if seq.state is RequestState.PREFILL_READY:
                q = classify(seq.prompt_tokens).value.replace("prefill_", "")
            elif seq.state is RequestState.DECODE_READY:
                q = "decode"
            elif seq.state is RequestState.WAITING_ADMISSION:
                lane_wait = max(lane_wait, now - seq.arrived_at)
                continue
            else:
                continue
            oldest[q] = max(oldest[q], now - seq.state_since)
        adm = sched.admission
        ast = adm.stats()
        tenants = [
            TenantSnapshot(
                str(t),
                adm.fairness.virtual_lag(t),
                ast.active_by_tenant.get(t, 0),
                p.max_active_sequences,
                ast.waiting_tokens_by_tenant.get(t, 0),
                p.max_waiting_tokens,
            )
            for t, p in {TenantId(DEFAULT_TENANT): adm.policy.default_tenant, **adm.policy.tenants}.items()
        ]
        return oldest, lane_wait, sched.kv.stats().committed_tokens, tenants

    def executor_status(self) -> dict[str, Any]:
        return self._call(self._status)

    # ------------------------------------------------------------------ API side (any thread)

    def submit(self, req: GenerationRequest, stream: EngineStream) -> None:
        """Refusals that need no scheduler raise EngineRejection here; everything else is decided on the loop,
        which resolves or fails ``stream.admitted()`` before the response's first byte (000 §5.2)."""
        if not req.prompt_ids:
            raise EngineRejection(
                RejectCode.INVALID, "the prompt is empty: at least one token is needed", param="prompt"
            )
        if self._failed is not None:
            raise EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} failed: {self._failed}")
        if self._reject_all_as_unavailable:
            raise EngineRejection(
                RejectCode.UNAVAILABLE, f"model {self.alias!r} is being reloaded; retry shortly", retry_after_s=1.0
            )
        self._known.add(req.request_id)
        self._inbox.put(_Arrive(req, stream, self._clock()))

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        """Idempotent; True if this core holds the request (it ends when the loop applies the cancel)."""
        if request_id not in self._known:
            return False
        self._inbox.put(_Cancel(RequestId(request_id), reason))
        return True

    def stop(self, request_id: str) -> bool:
        """A stop string matched in the request's text: end it as Completed with finish reason ``stop``."""
        if request_id not in self._known:
            return False
        self._inbox.put(_Stop(RequestId(request_id)))
        return True

    # ------------------------------------------------------------------ lifecycle (supervisor side)

    def set_state(self, state: ModelState, *, admission: ModelState | None = None) -> None:
        """Show ``state``; ``admission`` (default: the same) is what the scheduler admits under."""

        def apply() -> None:
            self._display_state = state
            target = admission or state
            if self._sched.model_state is not target and not (target is ModelState.READY and not self._serving):
                self._sched.set_model_state(target, self._clock())

        self._call(apply)

    def set_rejecting(self, on: bool) -> None:
        """During a reload new requests get 503 (000 §11, 001 §11.2), not a wait."""
        self._reject_all_as_unavailable = on

    def publish(self, rt: Runtime, generation: int) -> None:
        """The new generation passed golden + warmup: serve it (000 §11 step 10)."""

        def apply() -> None:
            self._exec.rt = rt
            self._sched.recover(GenerationId(generation), self._clock())
            self._serving = True
            self._display_state = ModelState.READY
            self._recovery_pending = False
            self._deferred_recovery = None
            self._monitor.reset_counters()  # a reset or reconfigure may have restarted them

        self._call(apply)
        self._reject_all_as_unavailable = False

    def retire(self, reason: str) -> None:
        """Stop serving this generation: fail everything holding device state (000 §10, 001 §11.3)."""

        def apply() -> None:
            self._serving = False
            self._sched.retire_generation(self._clock(), reason)
            # Jobs in flight are quarantined by the scheduler; keep their buffers until the runtime lets go.
            self._exec.retire()
            self._deferred_recovery = None  # this retirement is the recovery (or teardown) it waited for

        self._call(apply)

    def forget_device_state(self) -> None:
        """After a reset: free every runtime KV sequence and release buffers the runtime gave back."""
        self._call(self._exec.forget_device_state)

    def detach(self) -> None:
        def apply() -> None:
            self._serving = False
            self._exec.release_pool()
            self._exec.rt = None

        self._call(apply)

    def fail_all(self, reason: str) -> None:
        """Terminal failure of the generation (Failed): waiting and running requests get 503."""
        self.set_state(ModelState.FAILED)
        self.retire(reason)

    def shutdown(self) -> None:
        """End the loop thread and the completion threads (after the supervisor released the device)."""
        self._stopping = True
        self._inbox.put(_WAKE)
        self._thread.join(timeout=5)
        self._exec.stop_completers()

    def set_executor_mode(self, mode: ExecutorMode) -> dict[str, Any]:
        """Operator action: use ``mode`` for jobs not yet submitted; jobs in flight drain.

        The only way back to ping/pong after a downgrade (000 §14: never automatic). Refused
        (``ok: False``) when the configuration does not allow it: ``executor.max_inflight`` is the
        ceiling, and ping/pong cannot use a fixed engine.
        """

        def apply() -> dict[str, Any]:
            ceiling = self._sched.settings.budget.max_inflight_jobs
            if mode.max_inflight > ceiling:
                return {
                    **self._status(),
                    "ok": False,
                    "detail": f"{mode.value} needs executor.max_inflight {mode.max_inflight}; "
                    f"the configuration allows {ceiling}",
                }
            if mode is ExecutorMode.PINGPONG and self.options.fixed_engine:
                return {
                    **self._status(),
                    "ok": False,
                    "detail": "executor.fixed_engine is set: ping/pong needs both banks",
                }
            previous = self._mode
            self._change_mode(mode, None, "set by an operator")
            self._operator_changes.append({"at": time.time(), "from": previous.value, "to": mode.value})
            del self._operator_changes[:-MAX_DOWNGRADE_RECORDS]
            log.info(
                "executor mode of %s set by an operator: %s -> %s (jobs in flight drain)",
                self.alias,
                previous.value,
                mode.value,
            )
            return {**self._status(), "ok": True, "previous_mode": previous.value}

        return self._call(apply)

    def arm_stale_redelivery(self) -> None:
        """DIAGNOSTIC ONLY, never used in serving: deliberately break the generation rule once.

        ``calctl soak --inject stale-completion`` arms it to prove that the soak's checker catches a
        completion from a retired generation (000 §4 rule 4, 001 §13.1). Once armed, the core remembers
        the last token it delivered; at the first token of a *newer* generation (after a reload or a
        recovery), it delivers the remembered token, still tagged with its retired generation, to that
        new request as well. Then it disarms itself.
        """

        def apply() -> None:
            self._stale_probe = _StaleProbe()

        self._call(apply)

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the loop thread and return its result (its exception is raised here)."""
        if threading.current_thread() is self._thread:
            return fn()
        if self._failed is not None or not self._thread.is_alive():
            # The loop is gone: nobody else touches its state any more, so the caller may. Best effort:
            # this is teardown of an alias that already failed.
            return fn()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._inbox.put(_Command(fn, fut))
        while True:
            try:
                return fut.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive():  # the loop died with our command in its inbox
                    return fn()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._step()
        except Exception as exc:  # a bug: fail what the loop holds, once, loudly; never retry in a loop
            self._die(exc)

    def _step(self) -> None:
        inline = self._inline_job()
        if inline is not None:
            # sync: wait here for the one job in flight, in short slices so the inbox is still served.
            timeout = INLINE_SLICE_S
            if self._wake_at is not None:
                timeout = max(0.0, min(timeout, self._wake_at - self._clock()))
            if self._exec.wait_inline(inline, timeout):
                self._job_done(inline)
            elif self._exec.timed_out(inline):
                self._job_timed_out(inline)
            self._drain_inbox(block=False)
        else:
            self._drain_inbox(block=True)
        if self._stopping:
            return
        self._schedule_and_launch()
        if self._exec.quarantine:
            for late in self._exec.sweep_quarantine():
                self._apply_outcome(late)
        self._check_counters()
        self._inflight_n = len(self._exec.inflight)
        self._quarantined_n = len(self._exec.quarantine)

    def _inline_job(self) -> Inflight | None:
        if self._mode is not ExecutorMode.SYNC or not self._exec.inflight:
            return None
        return next(iter(self._exec.inflight.values()))

    def _drain_inbox(self, *, block: bool) -> None:
        inbox = self._inbox
        msg: object
        if block:
            timeout = None if self._wake_at is None else max(0.0, self._wake_at - self._clock())
            if self._exec.quarantine or self._serving:
                timeout = min(timeout, COUNTER_CHECK_S) if timeout is not None else COUNTER_CHECK_S
            try:
                msg = inbox.get(timeout=timeout)
            except queue.Empty:
                return
            self._handle(msg)
        while True:
            try:
                msg = inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(msg)

    def _handle(self, msg: object) -> None:
        if isinstance(msg, JobDone):
            inf = self._exec.inflight.get(msg.job_id)
            if inf is not None:
                self._job_done(inf)
        elif isinstance(msg, _Arrive):
            try:
                self._arrive(msg)
            except BaseException:
                # A bug while admitting it: the loop dies (``_die`` ends what it holds), but this request is not
                # held yet, so end its stream here or its client waits forever.
                if RequestId(msg.request.request_id) not in self._requests:
                    self._known.discard(msg.request.request_id)
                    msg.stream.post_rejected(EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} failed"))
                raise
        elif isinstance(msg, _Cancel):
            if msg.request_id in self._requests:
                self._sched.cancel(msg.request_id, self._clock())
                log.info("request %s on %s cancelled (%s)", msg.request_id, self.alias, msg.reason)
                self._deliver()
        elif isinstance(msg, _Stop):
            if msg.request_id in self._requests:
                self._sched.stop(msg.request_id, self._clock())
                self._deliver()
        elif isinstance(msg, JobTimedOut):
            inf = self._exec.inflight.get(msg.job_id)
            if inf is not None:
                self._job_timed_out(inf)
        elif isinstance(msg, _Command):
            if not msg.future.set_running_or_notify_cancel():
                return
            try:
                result = msg.fn()
            except BaseException as exc:  # the caller gets it; the loop goes on
                msg.future.set_exception(exc)
            else:
                msg.future.set_result(result)
            self._deliver()

    def _schedule_and_launch(self) -> None:
        now = self._clock()
        # schedule() also expires deadlines and promotes waiters while the model loads; it hands out jobs
        # only in Ready/Draining and not while halted for recovery, and at most as many as the executor
        # mode lets be in flight (Scheduler.set_inflight_limit).
        window_opened = self._sched.decode.window_opened_at
        out = self._sched.schedule(now)
        self._wake_at = out.wake_at
        if not out.jobs:
            self._deliver()
            return
        if not (self._serving and self._exec.rt is not None):  # defensive: never submit outside a generation
            for job in out.jobs:
                self._apply_outcome(
                    JobOutcome(job.job_id, job.generation, JobStatus.FAILED, detail="no generation is being served")
                )
            self._deliver()
            return
        pingpong = self._mode is ExecutorMode.PINGPONG
        for job in out.jobs:
            prompt = None
            if isinstance(job, DecodeJob):  # 000 §16 batch wait; a second batch this step waited 0
                self._m_batch_wait.observe(0.0 if window_opened is None else max(0.0, now - window_opened))
                window_opened = None
            elif isinstance(job, PrefillJob):
                ctx = self._requests.get(job.request_id)
                if ctx is not None:
                    prompt = ctx.gen.prompt_ids
                    if ctx.first_job_at is None:
                        ctx.first_job_at = self._clock()
                        self._m_queue.observe(ctx.first_job_at - ctx.arrived)
            launched = self._exec.launch(job, prompt, pingpong=pingpong)
            self._act_on_verdicts()
            if isinstance(launched, JobOutcome):
                self._apply_outcome(launched)
            elif self._mode is not ExecutorMode.SYNC:
                self._exec.hand_to_completer(launched)
        self._inflight_n = len(self._exec.inflight)
        # The tokens of the job that just finished go to their streams only now, after the next job was
        # submitted: waking the event loop hands it the GIL, and the device should not wait for that.
        self._deliver()

    # ------------------------------------------------------------------ admission

    def _arrive(self, msg: _Arrive) -> None:
        req, stream = msg.request, msg.stream
        rid = RequestId(req.request_id)
        now = self._clock()
        if self._failed is not None:
            self._known.discard(rid)
            stream.post_rejected(EngineRejection(RejectCode.UNAVAILABLE, f"model {self.alias!r} is unavailable"))
            return
        ticket = self._sched.arrive(rid, TenantId(req.tenant), now)
        if isinstance(ticket, AdmissionResult):
            self._m_verdict[ticket.verdict].inc()
            self._known.discard(rid)
            stream.post_rejected(self._rejection(ticket))
            return
        self._requests[rid] = _Request(req, stream, msg.at, request_rng(req.sampling.seed))
        result = self._sched.submit(
            ticket, prompt_tokens=len(req.prompt_ids), max_tokens=req.max_tokens, deadline_s=req.timeout_s, now=now
        )
        self._m_verdict[result.verdict].inc()
        if not result.verdict.accepted:
            self._requests.pop(rid, None)
            self._known.discard(rid)
            stream.post_rejected(self._rejection(result))
            self._deliver()
            return
        self._m_prompt.inc(len(req.prompt_ids))
        if result.verdict is Verdict.ADMIT:
            stream.post_admitted()
        self._deliver()

    def _rejection(self, result: AdmissionResult) -> EngineRejection:
        code = VERDICT_REJECTION.get(result.verdict, RejectCode.UNAVAILABLE)
        # A prompt too long for the model is the prompt's fault, whatever max_tokens says: the admission
        # result names the input (``prompt``; the chat endpoint reports it as ``messages``).
        param = result.field if code is RejectCode.INVALID else None
        return EngineRejection(code, f"{self.alias}: {result.reason}", param=param, retry_after_s=result.retry_after_s)

    # ------------------------------------------------------------------ completion

    def _job_done(self, inf: Inflight) -> None:
        fin = self._exec.finish(inf)
        self._act_on_verdicts()
        if fin is None:
            return
        outcome = fin.outcome
        if outcome.status is JobStatus.OK:
            outcome = self._sample(inf, fin)
        self._apply_outcome(outcome, fin.runtime_status, defer=True)

    def _job_timed_out(self, inf: Inflight) -> None:
        outcome = self._exec.time_out(inf)
        self._act_on_verdicts()
        if outcome is not None:
            self._apply_outcome(outcome, RuntimeStatus.TIMEOUT, defer=True)

    def _sample(self, inf: Inflight, fin: Finished) -> JobOutcome:
        logits = fin.logits
        assert logits is not None
        eos = self.codec.eos_token_id
        results = []
        for lane, rid in enumerate(inf.request_ids):
            ctx = self._requests.get(rid)
            if ctx is None:  # ended meanwhile (its lane result is discarded by the scheduler)
                results.append(LaneResult(rid, int(np.argmax(logits[lane]))))
                continue
            token = sample_token(logits[lane], ctx.gen.sampling, ctx.rng)
            results.append(LaneResult(rid, token, stop=(not ctx.gen.ignore_eos) and token == eos))
        return JobOutcome(inf.job_id, inf.core.generation, JobStatus.OK, tuple(results))

    def _apply_outcome(
        self, outcome: JobOutcome, runtime_status: RuntimeStatus | None = None, *, defer: bool = False
    ) -> None:
        """``update_from_output``, then deliver its events now, or (``defer``) at the end of this step, after
        the next launch. Either way its tokens are tagged with the job's generation (001 §13.1)."""
        self._sched.update_from_output(outcome, self._clock())
        if defer:
            prev = self._pending
            self._pending = (runtime_status or (prev[0] if prev else None), outcome.generation)
        else:
            self._deliver(runtime_status, generation=outcome.generation)
        self._inflight_n = len(self._exec.inflight)
        if self._deferred_recovery is not None and not self._exec.inflight:
            req, self._deferred_recovery = self._deferred_recovery, None
            log.info("engine %s: jobs in flight drained; recovery starts", self.alias)
            self._on_recovery(req)

    # ------------------------------------------------------------------ events -> streams

    def _deliver(self, runtime_status: RuntimeStatus | None = None, *, generation: GenerationId | None = None) -> None:
        """Deliver the scheduler's events. ``generation``: the job generation of the outcome being applied."""
        if self._pending is not None:  # a finished job's events waited for the next launch
            status, gen = self._pending
            self._pending = None
            runtime_status = runtime_status or status
            generation = gen if generation is None else generation
        while True:
            events = self._sched.drain_events()
            if not events:
                return
            now = self._clock()
            for ev in events:
                if isinstance(ev, TokenEmitted):
                    self._on_token(ev, now, self._sched.generation if generation is None else generation)
                elif isinstance(ev, TerminalEvent):
                    self._on_terminal(ev, now)
                elif isinstance(ev, LaneReleased):
                    t0 = self._clock()
                    self._exec.free_lane(ev.lane)
                    self._sched.confirm_kv_released(ev.lane)
                    self._m_kv_free.observe(self._clock() - t0)
                elif isinstance(ev, StaleCompletion):
                    self._metrics.stale.labels(self.alias).inc()
                    log.info("engine %s: stale completion of job %s dropped (%s)", self.alias, ev.job_id, ev.reason)
                elif isinstance(ev, RecoveryNeeded):
                    self._recovery_needed(ev, runtime_status)

    def _recovery_needed(self, ev: RecoveryNeeded, runtime_status: RuntimeStatus | None) -> None:
        self._apply(self._monitor.recovery_needed(f"{ev.status.value}: {ev.detail}"))
        if self._recovery_pending:
            return
        self._recovery_pending = True
        self._serving = False
        self._display_state = ModelState.DRAINING  # 001 §11.1 Ready -> Draining: never listed as ready meanwhile
        req = RecoveryRequest(self.alias, ev.status, ev.detail, runtime_status, int(self._sched.generation))
        if self._exec.inflight:
            # 000 §14: submitted jobs drain; the reset waits until they completed or timed out.
            self._deferred_recovery = req
            log.warning(
                "engine %s: recovery (%s) waits for %d job(s) in flight to drain",
                self.alias,
                ev.status.value,
                len(self._exec.inflight),
            )
        else:
            self._on_recovery(req)

    def _on_token(self, ev: TokenEmitted, now: float, generation: GenerationId) -> None:
        ctx = self._requests.get(ev.request_id)
        if ctx is None:
            return
        ctx.tokens = ev.index + 1
        if ctx.first_token_at is None:
            ctx.first_token_at = now
            self._m_ttft.observe(now - ctx.arrived)
        elif ctx.last_token_at is not None:
            gap = now - ctx.last_token_at
            self._m_tpot.observe(gap)
            self._apply(self._monitor.latency(gap))  # 000 §14 P99 regression
        ctx.last_token_at = now
        self._m_tokens.inc()
        tenant = self._m_tenant.get(ctx.gen.tenant)
        if tenant is None:
            tenant = self._m_tenant[ctx.gen.tenant] = self._metrics.tenant_tokens.labels(self.alias, ctx.gen.tenant)
        tenant.inc()
        event = TokenEvent(
            ev.token_id, prompt_tokens=len(ctx.gen.prompt_ids), completion_tokens=ctx.tokens, generation=int(generation)
        )
        ctx.stream.post_token(event)
        if self._stale_probe is not None:
            self._stale_probe_step(ctx.stream, event)

    def _on_terminal(self, ev: TerminalEvent, now: float) -> None:
        ctx = self._requests.pop(ev.request_id, None)
        self._known.discard(ev.request_id)
        end = ENDINGS[ev.reason]
        self._m_outcome[end.outcome].inc()
        if ctx is None:
            return
        self._m_e2e.observe(now - ctx.arrived)
        if ev.reason is CoreFinish.DEADLINE and ctx.first_job_at is None:
            # 000 §16 starvation event: the deadline came before the request ever reached the device.
            kind = self._sched.prefill.thresholds.classify(len(ctx.gen.prompt_ids))
            self._metrics.starvation.labels(self.alias, kind.value.replace("prefill_", "")).inc()
        self._record_request(ev, ctx, end, now)  # written with --records; always kept for recovery evidence
        if ctx.tokens == 0 and end.before_output is not None:
            # No output yet: the request is refused with its HTTP error (a queued request's deadline, a reset).
            public = public_before_output(end.outcome, ev.detail)
            if public != ev.detail:  # the engine's own text (job, chip, fault) goes to the log, never the client
                log.warning("request %s on %s ended before output: %s", ev.request_id, self.alias, ev.detail)
            ctx.stream.post_rejected(
                EngineRejection(end.before_output, f"{self.alias}: {public}", retry_after_s=ev.retry_after_s)
            )
            return
        error = None
        if end.finish is FinishReason.ERROR:
            error = f"{self.alias}: {ev.reason.value}: {ev.detail}"
        ctx.stream.post_end(
            TokenEvent(
                None,
                end.finish,
                error=error,
                prompt_tokens=len(ctx.gen.prompt_ids),
                completion_tokens=ctx.tokens,
                outcome=end.outcome.value,
            )
        )

    def _record_request(self, ev: TerminalEvent, ctx: _Request, end: Ending, now: float) -> None:
        """001 §14's per-request record (calctl.serving.records): internal, so it may name the chips."""
        first, last = ctx.first_token_at, ctx.last_token_at
        tpot = (last - first) / (ctx.tokens - 1) if first is not None and last is not None and ctx.tokens > 1 else None
        self._metrics.records.request(
            request_id=str(ev.request_id),
            model_alias=self.alias,
            model_generation=int(self._sched.generation),
            chips=list(self.chips),
            tenant=ctx.gen.tenant,
            prompt_tokens=len(ctx.gen.prompt_ids),
            output_tokens=ctx.tokens,
            queue_ms=ms(None if ctx.first_job_at is None else ctx.first_job_at - ctx.arrived),
            ttft_ms=ms(None if first is None else first - ctx.arrived),
            tpot_ms=ms(tpot),
            e2e_ms=ms(now - ctx.arrived),
            finish_reason=end.finish.value if ctx.tokens or end.before_output is None else None,
            error_class=None if end.outcome.value in ("stop", "length") else end.outcome.value,
        )

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
                "engine %s: DIAGNOSTIC stale-completion injection: re-delivering a token of retired generation "
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

    # ------------------------------------------------------------------ executor mode (000 §14)

    def _status(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "mode": self._mode.value,
            "configured_mode": self.options.mode.value,
            "max_inflight": self._sched.inflight_limit,
            "configured_max_inflight": self._sched.settings.budget.max_inflight_jobs,
            "inflight_jobs": len(self._exec.inflight),
            "banks": self._exec.slots.holders()
            if self._mode is ExecutorMode.PINGPONG or self._exec.slots.busy()
            else None,
            "downgrades": [d.as_dict() for d in self._downgrades],
            "operator_changes": list(self._operator_changes),
            "monitor": self._monitor.state(),
        }

    def _act_on_verdicts(self) -> None:
        for verdict in self._exec.take_verdicts():
            self._apply(verdict)

    def _apply(self, verdict: Downgrade | None) -> None:
        """Act on a monitor verdict: leave ping/pong for the configured one-in-flight mode."""
        if verdict is None or self._mode is not ExecutorMode.PINGPONG:
            return
        self._change_mode(self.options.downgrade.to, verdict.reason, verdict.detail)

    def _change_mode(self, mode: ExecutorMode, reason: DowngradeReason | None, detail: str) -> None:
        """Only new jobs see the new mode: the scheduler hands out no job until fewer than the new limit are
        in flight, so the ping/pong jobs already submitted drain first (000 §14). ``reason`` None: an
        operator's choice, not a downgrade (not counted in the metric). Jobs already handed to a completion
        thread stay there when the mode becomes sync; only jobs submitted from now on are waited inline."""
        previous = self._mode
        self._mode = mode
        self._sched.set_inflight_limit(mode.max_inflight)
        self._monitor.set_mode(mode)
        if reason is not None and previous is ExecutorMode.PINGPONG and mode is not ExecutorMode.PINGPONG:
            rec = DowngradeRecord(time.time(), previous, mode, reason, detail, len(self._exec.inflight))
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

    def _check_counters(self) -> None:
        """Feed the chip's job counters to the downgrade monitor (000 §14 counter anomalies)."""
        rt, now = self._exec.rt, self._clock()
        if rt is None or not self._serving or now < self._next_counter_check:
            return
        self._next_counter_check = now + COUNTER_CHECK_S
        try:
            counters = rt.counters()
        except RuntimeLayerError as exc:
            log.warning("engine %s: reading chip counters failed: %s", self.alias, exc)
            return
        own = len(self._exec.inflight) + len(self._exec.quarantine)
        for c in counters:
            if c.chip in self.chips:
                self._apply(self._monitor.counters(c, own_jobs=own, now=now))

    # ------------------------------------------------------------------ a bug in the loop

    def _die(self, exc: BaseException) -> None:
        """Fail every request this core holds and the alias, once; the thread then ends."""
        reason = f"internal error in the engine loop: {type(exc).__name__}: {exc}"
        self._failed = reason
        self._serving = False
        self._display_state = ModelState.FAILED
        log.error("engine %s: %s; model %s is Failed", self.alias, reason, self.alias, exc_info=exc)
        for rid, ctx in list(self._requests.items()):
            self._m_outcome[Outcome.INTERNAL].inc()
            if ctx.tokens == 0:
                ctx.stream.post_rejected(EngineRejection(RejectCode.UNAVAILABLE, f"{self.alias}: {reason}"))
            else:
                ctx.stream.post_end(
                    TokenEvent(
                        None,
                        FinishReason.ERROR,
                        error=f"{self.alias}: internal: {reason}",
                        prompt_tokens=len(ctx.gen.prompt_ids),
                        completion_tokens=ctx.tokens,
                        outcome=Outcome.INTERNAL.value,
                    )
                )
            self._known.discard(rid)
        self._requests.clear()
        # Messages still in the inbox: arrivals are refused, commands run on their caller (see _call).
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, _Arrive):
                self._known.discard(msg.request.request_id)
                msg.stream.post_rejected(EngineRejection(RejectCode.UNAVAILABLE, f"{self.alias}: {reason}"))
            elif isinstance(msg, _Command) and msg.future.set_running_or_notify_cancel():
                try:
                    msg.future.set_result(msg.fn())
                except BaseException as err:
                    msg.future.set_exception(err)
        self._known.clear()
        self._inflight_n = len(self._exec.inflight)
        self._quarantined_n = len(self._exec.quarantine)


__all__ = ["EngineCore", "RecoveryRequest", "WorkerOptions"]
