"""Scheduler: one alias's serving core, driven by its engine loop (000 §3–§9, 001 §9–§10).

The engine step follows vLLM v1 exactly::

    out = scheduler.schedule(now)          # jobs to submit + when to wake up
    ... submit out.jobs to the runtime, Wait ...
    events = scheduler.update_from_output(outcome, now)   # the step's events, in order
    ... the output processor delivers them: tokens, terminal events, lanes to free ...

Events of the other entry points (arrive, cancel, stop, schedule's deadline
expiries, retire) are taken with :meth:`Scheduler.drain_events`.

and API arrivals/cancels are serialised through the same loop
(:meth:`Scheduler.arrive`, :meth:`Scheduler.submit`, :meth:`Scheduler.cancel`).
The scheduler owns no device, thread, socket or clock; it composes
:class:`RequestRegistry`, :class:`AdmissionController`, :class:`KvLaneManager`,
:class:`PrefillScheduler` and :class:`DecodeScheduler` and keeps them
consistent:

* the KV lane is reserved at admission for the whole request and released
  only from the registry's terminal hook, which fires exactly once (000 §4);
* a job's KV write is ``begin_update`` at submit, ``commit`` only on device
  *and* output success, ``rollback`` on a clean failure, ``Unknown`` on
  timeout/fault (000 §9.2, 001 §10.3);
* a timeout or fault halts new submissions and asks for recovery; a
  timed-out job is quarantined, so its late completion is dropped as stale
  while its resources are still accounted (000 §4 rule 4, §7.4, 001 §11.3);
* a cancelled running request keeps its lane until its job drains (000 §4).

One ``Scheduler`` serves one model alias on one chip (001 §4's ModelWorker: one
engine core per alias, each with its own admission, queues and KV manager), so overload
of model A never touches model B's budgets (001 §9.2).

This module does not tokenise, sample, detokenise or stream: the engine does,
keyed by request id. It does not decide when to reset a device either: it
reports :class:`RecoveryNeeded` and waits for :meth:`retire_generation` /
:meth:`recover`.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, field

from calctl.serving.core.admission import (
    END_OF_REFUSAL,
    AdmissionController,
    AdmissionDecision,
    AdmissionResult,
    ModelState,
    Ticket,
)
from calctl.serving.core.decode import BatchProfile, DecodeBatch, DecodeScheduler
from calctl.serving.core.errors import InvariantViolation
from calctl.serving.core.ids import JobId, LaneId, ModelGenerationId, RequestId, TenantId
from calctl.serving.core.invariants import check_scheduler
from calctl.serving.core.kv import KvCapacity, KvLaneManager, KvState
from calctl.serving.core.prefill import Dropped, PrefillScheduler, WorkKind
from calctl.serving.core.registry import RequestRegistry
from calctl.serving.core.request import (
    RUNNING_STATES,
    CallbackDisposition,
    CancelOutcome,
    EndReason,
    RequestState,
    SequenceState,
    TerminalEvent,
)
from calctl.serving.core.settings import SchedulerSettings

_S = RequestState
_HOLDS_DEVICE_STATE = frozenset({_S.PREFILL_READY, _S.PREFILL_RUNNING, _S.DECODE_READY, _S.DECODE_RUNNING})


# -- jobs and outcomes --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefillJob:
    """Run the prefill graph over a whole prompt (never chunked, 000 §6) into one KV lane."""

    job_id: JobId
    generation: ModelGenerationId
    graph: str
    request_id: RequestId
    kv_lane: LaneId
    prompt_tokens: int
    queue: WorkKind


@dataclass(frozen=True, slots=True)
class DecodeJob:
    """Run one decode step for every active lane of ``batch`` (000 §7.1)."""

    job_id: JobId
    generation: ModelGenerationId
    batch: DecodeBatch


Job = PrefillJob | DecodeJob


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What :meth:`Scheduler.schedule` wants done: submit ``jobs``; call again at ``wake_at`` at the latest."""

    jobs: tuple[Job, ...]
    wake_at: float | None


class JobStatus(enum.Enum):
    """How a device job ended, as the engine observed it (000 §7.4, 001 §11.3)."""

    OK = "ok"  # device and output succeeded: commit KV
    FAILED = "failed"  # failed cleanly, nothing written (e.g. rejected at submit): roll KV back
    TIMEOUT = "timeout"  # Wait timed out; the job may still run: lanes Unknown, job quarantined
    FAULT = "fault"  # CCU exception, unknown DMA, corrupted output: lanes Unknown


@dataclass(frozen=True, slots=True)
class LaneResult:
    """The sampled token for one request of a finished job; ``stop`` = EOS or a stop sequence was hit."""

    request_id: RequestId
    token_id: int
    stop: bool = False


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A completion callback, tagged with the job and generation it belongs to (000 §4 rule 4)."""

    job_id: JobId
    generation: ModelGenerationId
    status: JobStatus
    results: tuple[LaneResult, ...] = ()
    detail: str = ""
    # A FAILED job the device ran (a non-fault status such as out of memory or invalid argument, after submit):
    # what it wrote is unknown, so its lanes go Unknown instead of rolling back (000 §7.4, §9.2 rule 6).
    kv_unknown: bool = False


# -- events -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenEmitted:
    """A token to stream to the client (index 0 comes from prefill)."""

    request_id: RequestId
    token_id: int
    index: int
    job_id: JobId


@dataclass(frozen=True, slots=True)
class LaneReleased:
    """A KV lane entered Releasing: free the runtime sequence, then call :meth:`Scheduler.confirm_kv_released`."""

    lane: LaneId
    request_id: RequestId


@dataclass(frozen=True, slots=True)
class StaleCompletion:
    """A completion for a retired or unknown job was dropped; free the job's host buffers (000 §4 rule 4)."""

    job_id: JobId
    generation: ModelGenerationId
    reason: str
    lanes: tuple[LaneId, ...] = ()


@dataclass(frozen=True, slots=True)
class RecoveryNeeded:
    """A timeout or fault left KV lanes Unknown; submissions are halted until :meth:`Scheduler.recover`."""

    generation: ModelGenerationId
    job_id: JobId
    status: JobStatus
    detail: str
    unknown_lanes: tuple[LaneId, ...]


#: The job a :class:`RecoveryNeeded` names when no job failed: the serving audit found a wrong answer.
AUDIT_JOB = JobId(-1)

Event = TokenEmitted | TerminalEvent | LaneReleased | StaleCompletion | RecoveryNeeded


@dataclass(slots=True)
class _Inflight:
    job_id: JobId
    generation: ModelGenerationId
    seqs: tuple[SequenceState, ...]
    lanes: tuple[LaneId, ...]
    submitted_at: float
    decode: bool = False  # a decode step (its duration feeds the batching window's step estimate)
    long_prefill: bool = False  # a prefill of the long queue (counts against LongPrefillQuota.max_running)


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot for 000 §16 metrics (no request ids: those go to logs, never labels)."""

    requests_by_state: dict[RequestState, int]
    prefill_depth: dict[WorkKind, int]
    decode_ready: int
    inflight_jobs: int
    quarantined_jobs: int
    kv_by_state: dict[KvState, int]
    kv_reserved_tokens: int
    waiting_requests: int
    waiting_prompt_tokens: int
    halted: bool
    terminal_events: int = field(default=0)


class Scheduler:
    """The pure serving core of one alias (see module docstring)."""

    def __init__(
        self,
        settings: SchedulerSettings,
        *,
        generation: ModelGenerationId,
        model_state: ModelState = ModelState.READY,
    ) -> None:
        self.settings = settings
        self.generation = generation
        budget = settings.budget
        self.kv = KvLaneManager(
            KvCapacity(budget.max_sequences, budget.max_kv_tokens, settings.max_seq, remove_tail=settings.remove_tail)
        )
        self.admission = AdmissionController(
            budget, settings.admission, self.kv, model_state=model_state, generation=generation
        )
        self.registry = RequestRegistry(self._on_terminal)
        self.prefill = PrefillScheduler(settings.prefill_thresholds, settings.service_weights)
        d = settings.decode
        self.decode = DecodeScheduler(
            settings.profiles,
            thresholds=d.profile_thresholds,
            batching_window_s=d.batching_window_s,
            max_tenant_lane_share=d.max_tenant_lane_share,
            deadline_granularity_s=d.deadline_granularity_s,
            step_estimate_s=d.step_estimate_s,
        )
        for p in self.decode.profiles:
            if p.max_seq < settings.max_seq:
                raise InvariantViolation(f"{p.name} max_seq {p.max_seq} < the alias's max_seq {settings.max_seq}")
        self._inflight: dict[JobId, _Inflight] = {}
        self._quarantine: dict[JobId, _Inflight] = {}
        self._deadlines: list[tuple[float, int, SequenceState]] = []  # admitted, not yet terminal
        self._counter = 0
        self._next_job = 1
        self._halted = False
        self._inflight_limit = settings.budget.max_inflight_jobs
        self._events: list[Event] = []
        self._long_waiting: set[RequestId] = set()  # accepted long prompts whose prefill has not started

    # -- API side ----------------------------------------------------------------------------

    @property
    def model_state(self) -> ModelState:
        return self.admission.model_state

    @property
    def halted(self) -> bool:
        """True after a timeout/fault until :meth:`recover`: no new job is handed out."""
        return self._halted

    def arrive(self, request_id: RequestId, tenant: TenantId, now: float) -> Ticket | AdmissionResult:
        """A request arrived: reserve its waiting slot before any expensive work (000 §5).

        A rejection here never enters the registry; the caller answers with its status.
        """
        ticket = self.admission.arrive(request_id, tenant, now)
        if isinstance(ticket, Ticket):
            self.registry.create(request_id, tenant, now)
        return ticket

    def submit(
        self,
        ticket: Ticket,
        *,
        prompt_tokens: int,
        max_tokens: int,
        deadline_s: float | None = None,
        now: float,
    ) -> AdmissionResult:
        """The prompt is counted: admit, queue or reject (000 §5.2). Rejections end the request (Failed)."""
        result = self.admission.decide(
            ticket,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            deadline_s=deadline_s,
            now=now,
            over_quota=self._long_quota_full(prompt_tokens),
        )
        seq = self.registry.get(ticket.request_id)
        if seq is None or seq.state is not _S.NEW:
            return result  # cancelled or expired while the prompt was counted; decide() rolled back
        seq.prompt_tokens = prompt_tokens
        seq.max_new_tokens = max_tokens
        if result.decision.accepted and self.prefill.thresholds.classify(prompt_tokens) is WorkKind.PREFILL_LONG:
            self._long_waiting.add(seq.request_id)
        if result.decision is AdmissionDecision.ADMIT:
            assert result.lane is not None and result.deadline is not None and result.virtual_finish is not None
            self._admitted(seq, result.lane, result.deadline, result.virtual_finish, now)
        elif result.decision is AdmissionDecision.QUEUE:
            assert result.deadline is not None
            seq.deadline = result.deadline  # the WFQ tag is set when the request is promoted
            waiting = _S.WAITING_ADMISSION if self.model_state is ModelState.READY else _S.WAITING_MODEL
            self.registry.move(seq, waiting, now)
            self._promote(now)
        else:
            self._refuse(seq, result, now)
        return result

    def _long_quota_full(self, prompt_tokens: int) -> str | None:
        """Why a long prompt is over LongPrefillQuota.max_waiting (admission answers it 429), else None."""
        cap = self.settings.long_prefill.max_waiting
        if cap is None or self.prefill.thresholds.classify(prompt_tokens) is not WorkKind.PREFILL_LONG:
            return None
        if len(self._long_waiting) < cap:
            return None
        return (
            f"long-prefill quota: {len(self._long_waiting)} prompts over "
            f"{self.prefill.thresholds.medium_max_tokens} tokens are already waiting for prefill, limit {cap}"
        )

    def abandon(self, request_id: RequestId, now: float, *, detail: str) -> bool:
        """End a request that failed before :meth:`submit` (e.g. the tokenizer refused it); rolls its slot back."""
        seq = self.registry.get(request_id)
        if seq is None or seq.state is not _S.NEW:
            return False
        return self.registry.finish(seq, _S.FAILED, EndReason.REJECTED_INVALID, now, detail=detail)

    def cancel(self, request_id: RequestId, now: float) -> CancelOutcome:
        """Idempotent cancel (000 §4): immediate unless a job holds the request, then on drain."""
        return self.registry.cancel(request_id, now)

    def stop(self, request_id: RequestId, now: float) -> CancelOutcome:
        """A stop string matched: Completed/STOP now, or when the job holding the request drains."""
        seq = self.registry.get(request_id)
        if seq is not None and seq.state is _S.DECODE_READY:
            self.decode.discard(seq)  # it leaves the decode queue through Finishing, not straight to terminal
        return self.registry.stop(request_id, now)

    def release_is_current(self, ev: LaneReleased) -> bool:
        """Is the lane ``ev`` announced still Releasing for that request? A reset that retired the generation
        between the announcement and its delivery made the lane Unknown (000 §9.2 rule 6): the runtime
        sequence went with the reset and the lane waits for :meth:`recover`, so the release is void."""
        view = self.kv.lane(ev.lane)
        return view.state is KvState.RELEASING and view.owner == ev.request_id

    def confirm_kv_released(self, lane: LaneId) -> None:
        """The runtime freed the sequence of a lane announced by :class:`LaneReleased` (000 §9.2 rule 2)."""
        self.kv.confirm_released(lane)

    def drain_events(self) -> list[Event]:
        """Everything that happened since the last call, in order."""
        events, self._events = self._events, []
        return events

    # -- engine step -------------------------------------------------------------------------

    def schedule(self, now: float) -> SchedulerOutput:
        """Expire, promote, then hand out jobs while in-flight room remains (000 §6 WRR, §7 decode)."""
        self._expire(now)
        self._promote(now)
        jobs: list[Job] = []
        wake_at: float | None = None
        # Draining keeps running admitted requests to completion (000 §12); nothing new is admitted.
        if not self._halted and self.model_state in (ModelState.READY, ModelState.DRAINING):
            max_inflight = min(self.settings.budget.max_inflight_jobs, self._inflight_limit)
            while len(self._inflight) < max_inflight:
                poll = self.decode.poll(now)
                kind = self.prefill.next_kind(decode_ready=poll.profile is not None, long_ready=self._long_allowed())
                if kind is None:
                    wake_at = poll.wake_at
                    break
                if kind is WorkKind.DECODE:
                    assert poll.profile is not None
                    job: Job | None = self._start_decode(poll.profile, now)
                else:
                    job = self._start_prefill(kind, now)
                if job is not None:
                    jobs.append(job)
        for candidate in (self.admission.next_deadline(), self._next_deadline()):
            if candidate is not None and (wake_at is None or candidate < wake_at):
                wake_at = candidate
        return SchedulerOutput(tuple(jobs), wake_at)

    def update_from_output(self, outcome: JobOutcome, now: float) -> list[Event]:
        """Apply one tagged completion (000 §4, §7.4); stale ones are dropped but accounted.

        Returns the step's events (vLLM's ``EngineCoreOutputs``): everything that happened since the last
        drain, this completion's tokens, terminal events, lane releases and recovery requests last."""
        self._apply_output(outcome, now)
        return self.drain_events()

    def _apply_output(self, outcome: JobOutcome, now: float) -> None:
        inf = self._inflight.get(outcome.job_id)
        if inf is None:
            retired = self._quarantine.pop(outcome.job_id, None)
            reason = (
                "job was retired (timeout or reset); its result is dropped"
                if retired is not None
                else "no such job in flight"
            )
            self._events.append(
                StaleCompletion(outcome.job_id, outcome.generation, reason, retired.lanes if retired else ())
            )
            return
        if inf.generation != outcome.generation:
            raise InvariantViolation(
                f"job {outcome.job_id} belongs to generation {inf.generation}, completion says {outcome.generation}"
            )
        del self._inflight[outcome.job_id]
        job = inf.job_id
        if outcome.status is JobStatus.OK and inf.decode:
            self.decode.observe_step(now - inf.submitted_at)  # the window's step estimate (000 §7.2 rule 4)
        if outcome.status is JobStatus.OK:
            results = {r.request_id: r for r in outcome.results}
            if len(results) != len(outcome.results) or set(results) != {s.request_id for s in inf.seqs}:
                raise InvariantViolation(  # 000 §7.4: request/lane consistency is checked, never assumed
                    f"job {job}: results for {sorted(results)} do not match its lanes "
                    f"{sorted(s.request_id for s in inf.seqs)}"
                )
            for seq, lane in zip(inf.seqs, inf.lanes, strict=True):
                verdict = self.registry.check_callback(seq.request_id, inf.generation, job)
                self.kv.commit(lane, job)  # device and output succeeded (000 §9.2 rule 5)
                self._after_success(seq, verdict, results[seq.request_id], job, now)
            return
        if outcome.status is JobStatus.FAILED:
            for seq, lane in zip(inf.seqs, inf.lanes, strict=True):
                verdict = self.registry.check_callback(seq.request_id, inf.generation, job)
                if outcome.kv_unknown:
                    self.kv.mark_unknown(lane)  # quarantined until the next reset/reload recovers it
                    self.registry.detach_job(seq)
                else:
                    self.kv.rollback(lane, job)
                if verdict is CallbackDisposition.CANCEL_DRAINED:
                    self.registry.finish(seq, _S.CANCELLED, EndReason.CANCELLED, now, detail="cancelled")
                elif verdict is CallbackDisposition.STOP_DRAINED:
                    self._finish_stopped(seq, now)  # the client has its whole output; the failed step is moot
                else:
                    self.registry.finish(
                        seq,
                        _S.FAILED,
                        EndReason.DEVICE_ERROR,
                        now,
                        detail=f"job {job} failed: {outcome.detail}",
                    )
            return
        # TIMEOUT / FAULT: lanes Unknown, whole job fails (no lane-level isolation declared, 000 §7.4).
        for seq, lane in zip(inf.seqs, inf.lanes, strict=True):
            self.kv.mark_unknown(lane)
            self.registry.detach_job(seq)
            self._end_lost(seq, now, EndReason.DEVICE_ERROR, f"job {job} {outcome.status.value}: {outcome.detail}")
        if outcome.status is JobStatus.TIMEOUT:
            self._quarantine[job] = inf  # it may still complete; that completion will be stale
        self._halted = True
        self._events.append(RecoveryNeeded(inf.generation, job, outcome.status, outcome.detail, inf.lanes))

    def board_answered_wrong(self, detail: str) -> None:
        """The serving audit's known-answer probe came back wrong (issue 50): halt submissions and ask for a
        recovery as a device fault does (001 §11.1, §11.3), naming no job (the probe's jobs succeeded; what they
        returned did not). Jobs in flight complete; the recovery retires the generation."""
        self._halted = True
        self._events.append(RecoveryNeeded(self.generation, AUDIT_JOB, JobStatus.FAULT, detail, ()))

    def set_inflight_limit(self, limit: int) -> None:
        """Hand out at most ``limit`` jobs at once from now on (capped by ``max_inflight_jobs``).

        The executor lowers it when it leaves ping/pong (000 §14): jobs already in flight drain and
        complete normally; no new job is handed out until fewer than ``limit`` are in flight.
        """
        if limit < 1:
            raise InvariantViolation(f"in-flight limit {limit} < 1")
        self._inflight_limit = limit

    @property
    def inflight_limit(self) -> int:
        return min(self.settings.budget.max_inflight_jobs, self._inflight_limit)

    # -- lifecycle (000 §10–§12, 001 §11) -------------------------------------------------------

    def set_model_state(self, state: ModelState, now: float) -> None:
        """Follow the ModelGeneration lifecycle; draining/unloading/failing withdraws the waiting queue (503)."""
        for rid, result in self.admission.set_model_state(state):
            seq = self.registry.get(rid)
            if seq is not None:
                self.registry.finish(
                    seq,
                    _S.FAILED,
                    EndReason.REJECTED_UNAVAILABLE,
                    now,
                    detail=result.reason,
                    retry_after_s=result.retry_after_s,
                )

    def retire_generation(self, now: float, reason: str) -> list[LaneId]:
        """The device is being reset: fail every request holding device state, quarantine every lane.

        In-flight jobs are quarantined (their completions become stale); every
        non-Free lane becomes Unknown until :meth:`recover`. Requests still
        waiting for admission keep waiting for the next generation. Returns the
        lanes made Unknown.
        """
        self._halted = True
        for job, inf in list(self._inflight.items()):
            self._quarantine[job] = inf
            del self._inflight[job]
            for seq in inf.seqs:
                self.registry.detach_job(seq)
        unknown: list[LaneId] = []
        for view in self.kv.holders():
            if view.state is not KvState.UNKNOWN:
                self.kv.mark_unknown(view.lane)
                unknown.append(view.lane)
        for seq in self.registry:
            if seq.state in _HOLDS_DEVICE_STATE or seq.state is _S.FINISHING:
                self._end_lost(
                    seq,
                    now,
                    EndReason.GENERATION_RETIRED,
                    f"generation {self.generation} retired: {reason}",
                    stoppable=seq.state is not _S.FINISHING,
                )
        return unknown

    def unloaded(self) -> list[LaneId]:
        """The generation was torn down and the device configuration dropped (unload, 000 §12 "free
        sequences/KV"): nothing of this model is on the device any more, so each Unknown lane is Free and no
        quarantined job can complete. Call after :meth:`retire_generation`; returns the lanes freed. The
        generation and admission stay as they are (the next load's :meth:`recover` publishes)."""
        if self._inflight:
            raise InvariantViolation(f"unloaded() with {len(self._inflight)} jobs in flight: retire_generation first")
        freed = self.kv.lanes_in(KvState.UNKNOWN)
        for lane in freed:
            self.kv.recover(lane)
        self._quarantine.clear()
        return freed

    def recover(self, generation: ModelGenerationId, now: float) -> None:
        """The device was reset and the new generation passed golden + warmup: reuse the lanes (000 §9.1)."""
        if self._inflight:
            raise InvariantViolation(f"recover() with {len(self._inflight)} jobs in flight: retire_generation first")
        for seq in self.registry:
            if seq.state in _HOLDS_DEVICE_STATE:
                raise InvariantViolation(f"recover(): {seq.request_id} still holds device state")
        for lane in self.kv.lanes_in(KvState.UNKNOWN):
            self.kv.recover(lane)
        self._quarantine.clear()  # the reset ended those jobs; a late completion is an unknown job
        self.generation = generation
        self._halted = False
        self.admission.set_model_state(ModelState.READY, generation)

    # -- reading -----------------------------------------------------------------------------

    @property
    def inflight_jobs(self) -> int:
        return len(self._inflight)

    def stats(self) -> SchedulerStats:
        kv = self.kv.stats()
        adm = self.admission.stats()
        return SchedulerStats(
            requests_by_state=self.registry.counts(),
            prefill_depth={
                k: self.prefill.depth(k)
                for k in (WorkKind.PREFILL_SHORT, WorkKind.PREFILL_MEDIUM, WorkKind.PREFILL_LONG)
            },
            decode_ready=self.decode.ready_count,
            inflight_jobs=len(self._inflight),
            quarantined_jobs=len(self._quarantine),
            kv_by_state=kv.by_state,
            kv_reserved_tokens=kv.reserved_tokens,
            waiting_requests=adm.waiting_requests,
            waiting_prompt_tokens=adm.waiting_prompt_tokens,
            halted=self._halted,
            terminal_events=self.registry.terminal_events,
        )

    def check_invariants(self) -> None:
        """Cross-component invariants: registry vs KV vs queues vs admission (000 §4, §9.2)."""
        check_scheduler(self, self._long_waiting, self._inflight)

    # -- internals ---------------------------------------------------------------------------

    def _admitted(self, seq: SequenceState, lane: LaneId, deadline: float, vf: float, now: float) -> None:
        seq.kv_lane = lane
        seq.generation = self.generation
        seq.deadline = deadline
        seq.virtual_finish = vf
        self.registry.move(seq, _S.PREFILL_READY, now)
        self.prefill.push(seq)
        self._counter += 1
        heapq.heappush(self._deadlines, (deadline, self._counter, seq))

    def _refuse(self, seq: SequenceState, result: AdmissionResult, now: float) -> None:
        """Fail a request admission refused, with the refusal's reason and ``Retry-After``."""
        self.registry.finish(
            seq,
            _S.FAILED,
            END_OF_REFUSAL[result.decision],
            now,
            detail=result.reason,
            retry_after_s=result.retry_after_s,
        )

    def _promote(self, now: float) -> None:
        for adm in self.admission.promote(now):
            seq = self.registry.get(adm.request_id)
            if seq is None:
                raise InvariantViolation(f"admission promoted {adm.request_id}, which is not live")
            self._admitted(seq, adm.lane, adm.deadline, adm.virtual_finish, now)

    def _expire(self, now: float) -> None:
        for rid, result in self.admission.expire(now):
            seq = self.registry.get(rid)
            if seq is not None:  # never admitted: the refusal admission decided (429, or 503 while loading)
                self._refuse(seq, result, now)
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            seq = heap[0][2]
            if seq.state in RUNNING_STATES:
                break  # its job must drain first; update_from_output fails it on completion
            heapq.heappop(heap)
            if not seq.state.terminal:
                self.registry.finish(
                    seq, _S.FAILED, EndReason.DEADLINE, now, detail=f"deadline expired in {seq.state.value}"
                )

    def _next_deadline(self) -> float | None:
        heap = self._deadlines
        while heap and heap[0][2].state.terminal:
            heapq.heappop(heap)
        if not heap or heap[0][2].state in RUNNING_STATES:
            return None  # a running head is re-checked when its job completes
        return heap[0][0]

    def _drop(self, dropped: Dropped, now: float) -> None:
        self.registry.finish(dropped.seq, _S.FAILED, dropped.reason, now, detail=dropped.detail)

    def _job_id(self) -> JobId:
        job = JobId(self._next_job)
        self._next_job += 1
        return job

    def _long_allowed(self) -> bool:
        """May another long prefill start (LongPrefillQuota.max_running)?"""
        cap = self.settings.long_prefill.max_running
        return cap is None or sum(1 for inf in self._inflight.values() if inf.long_prefill) < cap

    def _start_prefill(self, kind: WorkKind, now: float) -> PrefillJob | None:
        seq, dropped = self.prefill.pop(kind, now, self.generation)
        for d in dropped:
            self._drop(d, now)
        if seq is None:
            return None
        lane = seq.kv_lane
        assert lane is not None
        job = self._job_id()
        self.kv.begin_update(lane, job, 0, seq.prompt_tokens)  # the whole prompt, never a chunk (000 §6)
        self.registry.start_job(seq, job, self.generation, now)
        self._long_waiting.discard(seq.request_id)
        self._inflight[job] = _Inflight(
            job, self.generation, (seq,), (lane,), now, long_prefill=kind is WorkKind.PREFILL_LONG
        )
        return PrefillJob(
            job, self.generation, self.settings.prefill_graph, seq.request_id, lane, seq.prompt_tokens, kind
        )

    def _start_decode(self, profile: BatchProfile, now: float) -> DecodeJob | None:
        sel = self.decode.take(profile, now, self.generation)
        for d in sel.dropped:
            self._drop(d, now)
        if not sel.selected:
            return None
        job = self._job_id()
        seqs = list(sel.selected)
        lanes: list[LaneId] = []
        tokens: list[int] = []
        for seq in seqs:
            if seq.kv_lane is None or seq.last_token is None:
                raise InvariantViolation(f"job {job}: a DecodeReady request without a lane or a last token")
            lanes.append(seq.kv_lane)
            tokens.append(seq.last_token)
        positions = self.kv.begin_decode_batch(job, lanes)  # 000 §9.2 rule 4
        batch = DecodeBatch.build(
            job,
            self.generation,
            profile,
            [s.request_id for s in seqs],
            lanes,
            tokens,
            positions,
        )
        self.registry.start_batch(seqs, job, self.generation, now)
        self._inflight[job] = _Inflight(job, self.generation, tuple(seqs), batch.kv_lanes, now, decode=True)
        return DecodeJob(job, self.generation, batch)

    def _after_success(
        self, seq: SequenceState, verdict: CallbackDisposition, result: LaneResult, job: JobId, now: float
    ) -> None:
        if verdict is CallbackDisposition.CANCEL_DRAINED:  # the lane result is discarded, the batch drained (000 §18)
            self.registry.finish(seq, _S.CANCELLED, EndReason.CANCELLED, now, detail="cancelled while running")
            return
        if verdict is CallbackDisposition.STOP_DRAINED:  # a stop string ended it: this step's token is not output
            self._finish_stopped(seq, now)
            return
        if verdict is not CallbackDisposition.ACCEPT:
            raise InvariantViolation(f"{seq.request_id}: in-flight job {job} got verdict {verdict.value}")
        if seq.deadline <= now:
            self.registry.finish(seq, _S.FAILED, EndReason.DEADLINE, now, detail="deadline expired while running")
            return
        index = seq.generated_tokens
        seq.generated_tokens = index + 1
        seq.last_token = result.token_id
        self._events.append(TokenEmitted(seq.request_id, result.token_id, index, job))
        if result.stop or seq.generated_tokens >= seq.max_new_tokens:
            self.registry.move(seq, _S.FINISHING, now)
            self.registry.finish(seq, _S.COMPLETED, EndReason.STOP if result.stop else EndReason.LENGTH, now)
            return
        self.registry.move(seq, _S.DECODE_READY, now)
        self.decode.push(seq, now)

    def _finish_stopped(self, seq: SequenceState, now: float) -> None:
        """Completed/STOP for a request whose stop string matched while a job held it (its job is detached)."""
        if seq.state is not _S.FINISHING:
            self.registry.move(seq, _S.FINISHING, now)
        self.registry.finish(seq, _S.COMPLETED, EndReason.STOP, now, detail="stop string")

    def _end_lost(
        self, seq: SequenceState, now: float, reason: EndReason, detail: str, *, stoppable: bool = True
    ) -> None:
        """End a request whose device state is lost: Completed/STOP if a stop string had matched (and
        ``stoppable``), else Cancelled if the client cancelled, else Failed with ``reason``."""
        if stoppable and seq.stop_requested and not seq.cancel_requested:
            self._finish_stopped(seq, now)
            return
        self.registry.finish(
            seq,
            _S.CANCELLED if seq.cancel_requested else _S.FAILED,
            EndReason.CANCELLED if seq.cancel_requested else reason,
            now,
            detail=detail,
        )

    def _on_terminal(self, seq: SequenceState, event: TerminalEvent, previous: RequestState) -> None:
        """Exactly once per request (000 §4 rule 3): release everything it holds, then publish the event."""
        self._long_waiting.discard(seq.request_id)
        if previous is _S.PREFILL_READY:
            self.prefill.discard(seq)
        elif previous is _S.DECODE_READY:
            self.decode.discard(seq)
        self.admission.release(
            seq.request_id,
            served_prompt_tokens=seq.prompt_tokens if seq.generated_tokens else 0,
            served_output_tokens=seq.generated_tokens,
        )
        if seq.kv_lane is not None and self.kv.release(seq.kv_lane) is KvState.RELEASING:
            self._events.append(LaneReleased(seq.kv_lane, seq.request_id))
        self._events.append(event)


__all__ = [
    "DecodeJob",
    "Event",
    "JobOutcome",
    "JobStatus",
    "LaneReleased",
    "LaneResult",
    "PrefillJob",
    "RecoveryNeeded",
    "Scheduler",
    "StaleCompletion",
    "TokenEmitted",
]
