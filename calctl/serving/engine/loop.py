"""EngineCore: one alias, one thread, the only caller of its scheduler (vLLM v1 ``EngineCore``; 001 §4, §10.2).

"Who changes a request's state": this thread, and nothing else. Every other
party only posts to its inbox:

* API threads and event loops post arrivals, cancels and stops (a stop string matched);
* the supervisor posts lifecycle commands (publish, retire, set state, forget device state,
  executor mode) and waits for each to be applied;
* the device executor's completion threads post "job done" / "job timed out".

Each step of the loop::

    drain the inbox -> schedule(now) -> launch the jobs -> (sync: wait inline)
      -> update_from_output for every finished job (it returns the step's events)
      -> the OutputProcessor delivers them to the streams, meters and records them
      -> the step's posts go to each event loop in one hand-off (streams.one_handoff)

Sampling, delivery, metering and the 001 §14 request records are the
:class:`~calctl.serving.engine.output.OutputProcessor`'s (vLLM's seam); the core
keeps the loop, admission, the device executor and the lifecycle.

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
000 §14) and follows the commands it is sent. The model's lifecycle as the core
holds it is one :class:`Lifecycle`, written only on this thread: every supervisor
command, ``set_rejecting`` included, goes through the inbox.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from calctl.errors import ConfigError
from calctl.package.model import Model
from calctl.runtime.errors import RuntimeStatus
from calctl.runtime.interface import Runtime
from calctl.serving.config import ExecutorMode
from calctl.serving.core.admission import ModelState
from calctl.serving.core.ids import ModelGenerationId, RequestId
from calctl.serving.core.scheduler import (
    DecodeJob,
    Event,
    JobOutcome,
    JobStatus,
    LaneReleased,
    RecoveryNeeded,
    Scheduler,
    SchedulerSettings,
)
from calctl.serving.engine.admit import AdmissionFront
from calctl.serving.engine.device import DeviceExecutor, Inflight, JobDone, JobTimedOut
from calctl.serving.engine.inbox import Arrive, Cancel, Command, Inbox, Stop
from calctl.serving.engine.metrics import EngineMetrics, ModelSnapshot
from calctl.serving.engine.mode_control import COUNTER_CHECK_S, ModeControl
from calctl.serving.engine.modes import DowngradeRecord
from calctl.serving.engine.monitor import ExecutorMonitor
from calctl.serving.engine.options import Clock, CoreOptions
from calctl.serving.engine.output import DeliveryTap, LaunchTap, OutputProcessor, RequestContext
from calctl.serving.engine.snapshot import model_snapshot
from calctl.serving.engine.streams import EngineStream, one_handoff
from calctl.serving.protocol import GenerationRequest
from calctl.serving.text import TextCodec

log = logging.getLogger("calctl.serve")
T = TypeVar("T")

#: sync mode: the longest the core waits on the device before it looks at its inbox again.
INLINE_SLICE_S = 0.002


@dataclass
class RecoveryRequest:
    alias: str
    status: JobStatus
    detail: str
    runtime_status: RuntimeStatus | None
    # The generation the fault happened in: a recovery that republished the alias since (a board reset for
    # the other alias's fault of the same hang) already covered it (DeviceSupervisor.recover).
    generation: int | None = None


# -- inbox messages ------------------------------------------------------------------------------


@dataclass
class Lifecycle:
    """The model's lifecycle as its core holds it: one object, written only on the core's thread (any thread
    reads it). ``state`` is what /health, /v1/models and the metrics show; the scheduler admits under its own
    model state, which :meth:`EngineCore.set_state` sets in the same command."""

    state: ModelState = ModelState.UNLOADED
    serving: bool = False  # a published generation: jobs may be submitted
    rejecting: bool = False  # a reload is under way: every new request is 503 at submit (000 §11)
    recovery_pending: bool = False  # a recovery was asked for; publish or retire answers it
    failed: str | None = None  # a bug ended the loop: why (terminal)


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
        options: CoreOptions | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.alias = alias
        self.model = model
        self.codec = codec
        self.options = options or CoreOptions()
        if self.options.mode.max_inflight > settings.budget.max_inflight_jobs:
            raise ConfigError(
                f"{alias}: executor mode {self.options.mode.value} needs max_inflight "
                f"{self.options.mode.max_inflight}, the configuration allows {settings.budget.max_inflight_jobs}"
            )
        self._metrics = metrics
        self._on_recovery = on_recovery
        self._clock = clock
        self._inbox = Inbox()
        self._sched = Scheduler(settings, generation=ModelGenerationId(0), model_state=ModelState.UNLOADED)
        self._monitor = ExecutorMonitor(
            self.options.downgrade, self.options.mode, chip_exclusive=self.options.chip_exclusive
        )
        self._exec = DeviceExecutor(
            alias,
            model,
            metrics,
            self._monitor,
            post=self._inbox.post,
            job_timeout_s=self.options.job_timeout_s,
            poll_s=self.options.poll_s,
            fixed_engine=self.options.fixed_engine,
            clock=clock,
        )
        self._modes = ModeControl(
            alias, model.target_chips, self.options, self._sched, self._exec, self._monitor, metrics
        )
        # Request ids submitted and not yet terminal, written by submitters (add) and this thread (discard):
        # what drained() and cancel() read without waiting for the loop.
        self._known: set[str] = set()
        self._out = OutputProcessor(
            alias,
            model.target_chips,
            codec,
            metrics,
            known=self._known,
            generation=lambda: self._sched.generation,
            queue_class=lambda n: self._sched.prefill.thresholds.classify(n).value.replace("prefill_", ""),
            on_token_gap=lambda gap: self._modes.apply(self._monitor.latency(gap)),
        )
        self._requests: dict[RequestId, RequestContext] = self._out.requests
        self._admit = AdmissionFront(alias, self._sched, self._out, self._known, metrics, model)
        self.life = Lifecycle()
        self._stopping = False  # shutdown(): the thread ends (not a model state)
        self._deferred_recovery: RecoveryRequest | None = None  # waits for the jobs still in flight to drain
        self._wake_at: float | None = None
        # Events of outcomes applied but not yet delivered, with their runtime status and job generation
        # (see _apply_outcome): delivered after the next launch.
        self._pending: list[tuple[list[Event], RuntimeStatus | None, ModelGenerationId]] = []
        self._inflight_n = 0
        self._quarantined_n = 0
        self._m_kv_free = metrics.kv_free.labels(alias)
        self._thread = threading.Thread(target=self._run, name=f"engine-{alias}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ reading (any thread)

    @property
    def state(self) -> ModelState:
        return self.life.state

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
        return self.life.failed

    def is_ready(self) -> bool:
        life = self.life
        return life.state is ModelState.READY and life.serving and life.failed is None

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
        return self._modes.mode

    def downgrades(self) -> list[DowngradeRecord]:
        return list(self._modes.downgrades)

    def snapshot(self) -> ModelSnapshot:
        """000 §16 gauges of this alias, computed on the loop at scrape time (never per token)."""
        life = self.life
        return self._call(
            lambda: model_snapshot(
                self.alias,
                self._sched,
                self._clock(),
                state=life.state.value,
                generation=self.generation if life.serving else None,
                executor_mode=self._modes.mode.value,
            )
        )

    def executor_status(self) -> dict[str, Any]:
        return self._call(self._modes.status)

    # ------------------------------------------------------------------ API side (any thread)

    def submit(self, req: GenerationRequest, stream: EngineStream) -> None:
        """Refusals that need no scheduler raise EngineRejection here; everything else is decided on the loop,
        which resolves or fails ``stream.admitted()`` before the response's first byte (000 §5.2)."""
        self._admit.refuse_early(req, failed=self.life.failed, rejecting=self.life.rejecting)
        self._known.add(req.request_id)
        self._inbox.post(Arrive(req, stream, self._clock()))

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        """Idempotent; True if this core holds the request (it ends when the loop applies the cancel)."""
        if request_id not in self._known:
            return False
        self._inbox.post(Cancel(RequestId(request_id), reason))
        return True

    def stop(self, request_id: str) -> bool:
        """A stop string matched in the request's text: end it as Completed with finish reason ``stop``."""
        if request_id not in self._known:
            return False
        self._inbox.post(Stop(RequestId(request_id)))
        return True

    # ------------------------------------------------------------------ lifecycle (supervisor side)

    def set_state(self, state: ModelState, *, admission: ModelState | None = None) -> None:
        """Show ``state``; ``admission`` (default: the same) is what the scheduler admits under."""

        def apply() -> None:
            self.life.state = state
            target = admission or state
            if self._sched.model_state is not target and not (target is ModelState.READY and not self.life.serving):
                self._sched.set_model_state(target, self._clock())

        self._call(apply)

    def set_rejecting(self, on: bool) -> None:
        """During a reload new requests get 503 (000 §11, 001 §11.2), not a wait. Applied on the loop."""
        self._call(lambda: setattr(self.life, "rejecting", on))

    def publish(self, rt: Runtime, generation: int) -> None:
        """The new generation passed golden + warmup: serve it (000 §11 step 10)."""

        def apply() -> None:
            self._exec.rt = rt
            self._sched.recover(ModelGenerationId(generation), self._clock())
            life = self.life
            life.serving, life.state, life.recovery_pending, life.rejecting = True, ModelState.READY, False, False
            self._deferred_recovery = None
            self._monitor.reset_counters()  # a reset or reconfigure may have restarted them

        self._call(apply)

    def retire(self, reason: str) -> None:
        """Stop serving this generation: fail everything holding device state (000 §10, 001 §11.3)."""

        def apply() -> None:
            self.life.serving = False
            self._sched.retire_generation(self._clock(), reason)
            # Jobs in flight are quarantined by the scheduler; keep their buffers until the runtime lets go.
            self._exec.retire()
            self._deferred_recovery = None  # this retirement is the recovery (or teardown) it waited for

        self._call(apply)

    def forget_device_state(self) -> None:
        """After a reset: free every runtime KV sequence and release buffers the runtime gave back."""
        self._call(self._exec.forget_device_state)

    def detach(self) -> None:
        """The configuration is gone (unload, shutdown): its lanes are Free again (000 §12), not Unknown."""

        def apply() -> None:
            self.life.serving = False
            self._exec.release_pool()
            self._exec.rt = None
            self._sched.unloaded()

        self._call(apply)

    def fail_all(self, reason: str) -> None:
        """Terminal failure of the generation (Failed): waiting and running requests get 503."""
        self.set_state(ModelState.FAILED)
        self.retire(reason)

    def shutdown(self) -> None:
        """End the loop thread and the completion threads (after the supervisor released the device)."""
        self._stopping = True
        self._inbox.wake()
        self._thread.join(timeout=5)
        self._exec.stop_completers()

    def set_executor_mode(self, mode: ExecutorMode) -> dict[str, Any]:
        """Operator action: use ``mode`` for jobs not yet submitted; jobs in flight drain. The only way back to
        ping/pong after a downgrade (000 §14: never automatic). Refused (``ok: False``) when the configuration
        does not allow it: ``executor.max_inflight`` is the ceiling, and ping/pong cannot use a fixed engine."""
        return self._call(lambda: self._modes.set_by_operator(mode))

    def add_taps(self, *, delivery: DeliveryTap | None = None, launch: LaunchTap | None = None) -> None:
        """``delivery`` sees every token after it was posted, ``launch`` every job just before it is launched
        (diagnostics, never used in serving: the soak's stale-completion injection, the lanes of its jobs)."""
        self._call(lambda: self._out.add_taps(delivery, launch))

    def board_answered_wrong(self, detail: str) -> None:
        """The serving audit got a wrong answer (engine/audit.py): out of service by the recovery path (001 §11.1)."""
        self._call(lambda: self._sched.board_answered_wrong(detail))

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the loop thread and return its result (its exception is raised here)."""
        return self._inbox.call(fn, self._thread, dead=self.life.failed is not None)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            while not self._stopping:
                with one_handoff():  # the step's posts reach each event loop in one wake-up, after its launches
                    self._step()
        except Exception as exc:  # a bug: fail what the loop holds, once, loudly; never retry in a loop
            self._die(exc)

    def _step(self) -> None:
        inline = self._inline_job()
        if inline is not None:
            # Wait here for the job, in short slices so the inbox is still served.
            timeout = INLINE_SLICE_S
            if self._wake_at is not None:
                timeout = max(0.0, min(timeout, self._wake_at - self._clock()))
            timeout = self._exec.wait_s(inline, timeout)
            if self._exec.wait_inline(inline, timeout):
                self._job_done(inline)
            elif self._exec.timed_out(inline):
                self._job_timed_out(inline)
            elif not self._drain_inbox(block=False) and not self._due():
                # Job still running, nothing posted, no deadline due: nothing to schedule. An idle slice stays
                # cheap, since its CPU comes out of the cores the job computes on.
                self._modes.check_counters(self._clock(), self.life.serving)
                return
            self._drain_inbox(block=False)
        else:
            self._drain_inbox(block=True)
        if self._stopping:
            return
        self._schedule_and_launch()
        if self._exec.quarantine:
            for late in self._exec.sweep_quarantine():
                self._apply_outcome(late)
        self._modes.check_counters(self._clock(), self.life.serving)
        self._inflight_n = len(self._exec.inflight)
        self._quarantined_n = len(self._exec.quarantine)

    def _inline_job(self) -> Inflight | None:
        """sync's one job, else (async, ping/pong) a job due about now (end_window.py): this thread waits on it."""
        if self._modes.mode is ExecutorMode.SYNC:
            return next(iter(self._exec.inflight.values()), None)
        return self._exec.due_now()

    def _drain_inbox(self, *, block: bool) -> int:
        """Handle what the inbox holds (``block``: wait for the first until the next wake-up); how many."""
        timeout: float | None = 0.0
        if block:
            timeout = None if self._wake_at is None else max(0.0, self._wake_at - self._clock())
            if self._exec.quarantine or self.life.serving:
                timeout = min(timeout, COUNTER_CHECK_S) if timeout is not None else COUNTER_CHECK_S
            timeout = self._exec.soonest_wait_s(timeout)
        return self._inbox.drain(self._handle, block=block, timeout=timeout)

    def _due(self) -> bool:  # a deadline of the scheduler's due, or a quarantined job to sweep
        return bool(self._exec.quarantine) or (self._wake_at is not None and self._clock() >= self._wake_at)

    def _handle(self, msg: object) -> None:
        if isinstance(msg, JobDone):
            inf = self._exec.inflight.get(msg.job_id)
            if inf is not None:
                self._job_done(inf)
        elif isinstance(msg, Arrive):
            with contextlib.ExitStack() as failing:
                # A bug while admitting it: the loop dies (``_die`` ends what it holds), but this request is not
                # held yet, so end its stream here or its client waits forever.
                failing.callback(self._admit.refuse_unheld, msg.request, msg.stream)
                self._arrive(msg)
                failing.pop_all()
        elif isinstance(msg, Cancel):
            if msg.request_id in self._requests:
                self._sched.cancel(msg.request_id, self._clock())
                log.info("request %s on %s cancelled (%s)", msg.request_id, self.alias, msg.reason)
                self._deliver()
        elif isinstance(msg, Stop):
            if msg.request_id in self._requests:
                self._sched.stop(msg.request_id, self._clock())
                self._deliver()
        elif isinstance(msg, JobTimedOut):
            inf = self._exec.inflight.get(msg.job_id)
            if inf is not None:
                self._job_timed_out(inf)
        elif isinstance(msg, Command):
            msg.run()  # an exception goes to the caller; the loop goes on
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
        if not (self.life.serving and self._exec.rt is not None):  # defensive: never submit outside a generation
            for job in out.jobs:
                self._apply_outcome(
                    JobOutcome(job.job_id, job.generation, JobStatus.FAILED, detail="no generation is being served")
                )
            self._deliver()
            return
        pingpong = self._modes.mode is ExecutorMode.PINGPONG
        for job in out.jobs:
            prompt = self._out.launching(job, now, window_opened, self._clock())
            if isinstance(job, DecodeJob):
                window_opened = None  # a second batch this step waited 0
            launched = self._exec.launch(job, prompt, pingpong=pingpong)
            self._modes.act_on_verdicts()
            if isinstance(launched, JobOutcome):
                self._apply_outcome(launched)
            elif self._modes.mode is not ExecutorMode.SYNC:
                self._exec.hand_to_completer(launched)
        self._inflight_n = len(self._exec.inflight)
        time.sleep(0)  # the GIL to the chip's thread the submit woke: delivery below held it off 0.3 ms a token
        # The tokens of the job that just finished go to their streams only now, after the next job was
        # submitted: waking the event loop hands it the GIL, and the device should not wait for that.
        self._deliver()

    # ------------------------------------------------------------------ admission

    def _arrive(self, msg: Arrive) -> None:
        if self.life.failed is not None:
            self._admit.refuse_unavailable(msg.request, msg.stream, "is unavailable")
            return
        self._admit.arrive(msg.request, msg.stream, msg.at, self._clock())
        self._deliver()

    # ------------------------------------------------------------------ completion

    def _job_done(self, inf: Inflight) -> None:
        fin = self._exec.finish(inf)
        self._modes.act_on_verdicts()
        if fin is None:
            return
        outcome = fin.outcome
        if outcome.status is JobStatus.OK:
            outcome = self._out.sample(inf, fin)
        self._apply_outcome(outcome, fin.runtime_status, defer=True)

    def _job_timed_out(self, inf: Inflight) -> None:
        outcome = self._exec.time_out(inf)
        self._modes.act_on_verdicts()
        if outcome is not None:
            self._apply_outcome(outcome, RuntimeStatus.TIMEOUT, defer=True)

    def _apply_outcome(
        self, outcome: JobOutcome, runtime_status: RuntimeStatus | None = None, *, defer: bool = False
    ) -> None:
        """``update_from_output``, then deliver the step's events it returns now, or (``defer``) at the end of
        this step, after the next launch. Either way its tokens are tagged with the job's generation (001 §13.1)."""
        events = self._sched.update_from_output(outcome, self._clock())
        if defer:
            self._pending.append((events, runtime_status, outcome.generation))
        else:
            self._deliver(events, runtime_status, outcome.generation)
        self._inflight_n = len(self._exec.inflight)
        if self._deferred_recovery is not None and not self._exec.inflight:
            req, self._deferred_recovery = self._deferred_recovery, None
            log.info("engine %s: jobs in flight drained; recovery starts", self.alias)
            self._on_recovery(req)

    # ------------------------------------------------------------------ events -> streams

    def _deliver(
        self,
        events: list[Event] | None = None,
        runtime_status: RuntimeStatus | None = None,
        generation: ModelGenerationId | None = None,
    ) -> None:
        """Hand events to the output processor: first those of finished jobs that waited for the next launch,
        then ``events`` (of the outcome being applied, job ``generation``), then whatever else the scheduler
        produced. The events it hands back act on the device (a lane to free) or the lifecycle (a recovery).

        First the executor's metering and records of the jobs finished and launched meanwhile: held until now
        (after the step's launches) so that a job's end reaches the next submit sooner, never skipped."""
        self._exec.bookkeeping()
        batches, self._pending = self._pending, []
        if events is not None:
            batches.append((events, runtime_status, generation or self._sched.generation))
        while True:
            batches.append((self._sched.drain_events(), runtime_status, self._sched.generation))
            if not any(evs for evs, _, _ in batches):
                return
            for evs, status, gen in batches:
                if evs:
                    # 001 §11.1: the alias leaves Ready before any client hears of the fault that needs a
                    # recovery, so nothing that waits for "Ready again" can read the old Ready in between.
                    for ev in evs:
                        if isinstance(ev, RecoveryNeeded):
                            self._recovery_needed(ev, status)
                    self._control(self._out.process(evs, self._clock(), gen))
            batches = []

    def _control(self, events: list[object]) -> None:
        """The events the output processor handed back that act on the device: lanes to free. (A recovery
        was started before the events were delivered: :meth:`_deliver`.)"""
        for ev in events:
            if isinstance(ev, LaneReleased):
                if not self._sched.release_is_current(ev):
                    log.info("engine %s: lane %s release void: a reset retired it meanwhile", self.alias, ev.lane)
                    continue
                t0 = self._clock()
                self._exec.free_lane(ev.lane)
                self._sched.confirm_kv_released(ev.lane)
                self._m_kv_free.observe(self._clock() - t0)

    def _recovery_needed(self, ev: RecoveryNeeded, runtime_status: RuntimeStatus | None) -> None:
        self._modes.apply(self._monitor.recovery_needed(f"{ev.status.value}: {ev.detail}"))
        life = self.life
        if life.recovery_pending:
            return
        if not life.serving:
            # Announced before the supervisor retired this generation (a reset of the board or of this chip,
            # or a reload), delivered after it: that reset is the recovery. Asking for one now would show the
            # alias Draining while it is Recovering and queue a second reset for the same fault, which a failed
            # recovery would not skip (the generation is unchanged), spending the reset budget on a Failed alias.
            void = f"generation {ev.generation} was retired meanwhile ({ev.status.value}: {ev.detail})"
            log.info("engine %s: recovery request void: %s", self.alias, void)
            return
        life.recovery_pending, life.serving = True, False
        life.state = ModelState.DRAINING  # 001 §11.1 Ready -> Draining: never listed as ready meanwhile
        req = RecoveryRequest(self.alias, ev.status, ev.detail, runtime_status, int(ev.generation))
        if self._exec.inflight:
            # 000 §14: submitted jobs drain; the reset waits until they completed or timed out.
            self._deferred_recovery = req
            n = len(self._exec.inflight)
            log.warning("engine %s: recovery (%s) waits for %d job(s) in flight", self.alias, ev.status.value, n)
        else:
            self._on_recovery(req)

    # ------------------------------------------------------------------ a bug in the loop

    def _die(self, exc: BaseException) -> None:
        """Fail every request this core holds and the alias, once; the thread then ends."""
        reason = f"internal error in the engine loop: {type(exc).__name__}: {exc}"
        life = self.life
        life.failed, life.serving, life.state = reason, False, ModelState.FAILED
        log.error("engine %s: %s; model %s is Failed", self.alias, reason, self.alias, exc_info=exc)
        self._out.fail_all(reason)
        # Messages still in the inbox: arrivals are refused, commands run here (later ones on their caller).
        for arrival in self._inbox.close():  # 503, counted and recorded like any refusal (001 §14)
            self._admit.refuse_unavailable(arrival.request, arrival.stream, f"failed: {reason}")
        self._known.clear()
        self._inflight_n = len(self._exec.inflight)
        self._quarantined_n = len(self._exec.quarantine)


__all__ = ["EngineCore", "Lifecycle", "RecoveryRequest"]
