"""RequestRegistry: the one owner of request state transitions (000 §4).

A single-threaded actor API: the engine serialises every call (API arrivals,
cancels and device completions all go through its loop), so no field of a
:class:`~calctl.serving.core.request.SequenceState` is ever written by two
parties (000 §4 rule 1). Guarantees:

* every transition is checked against ``ALLOWED_TRANSITIONS`` (000 §2);
* cancel is idempotent: immediate in New/Waiting/Ready, a flag while Running
  (the job still drains, 000 §4 rule 2);
* the terminal state is entered once, and the terminal hook fires once (rule 3);
* completion callbacks carry generation and job id; a stale one is reported as
  :attr:`CallbackDisposition.STALE` so the caller drops it and still reclaims the
  job's resources (rule 4).

This module does not release KV lanes, queue slots or quotas itself: the
terminal hook given at construction does (the scheduler wires it), which is
what makes that release exactly-once. It keeps no timers; ``now`` is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from calctl.serving.core.errors import IllegalTransition, InvariantViolation
from calctl.serving.core.ids import JobId, ModelGenerationId, RequestId, TenantId
from calctl.serving.core.request import (
    ALLOWED_TRANSITIONS,
    IMMEDIATELY_CANCELLABLE,
    RUNNING_STATES,
    TERMINAL_STATES,
    CallbackDisposition,
    CancelOutcome,
    EndReason,
    RequestState,
    SequenceState,
    TerminalEvent,
)

TerminalHook = Callable[[SequenceState, TerminalEvent, RequestState], None]
"""Called once per request on entering a terminal state: (record, event, state it left)."""


class RequestRegistry:
    """Live requests by id, their transitions, and a bounded memory of recently finished ones."""

    def __init__(self, on_terminal: TerminalHook | None = None, *, remember_terminal: int = 4096) -> None:
        if remember_terminal < 0:
            raise ValueError("remember_terminal must be >= 0")
        self._live: dict[RequestId, SequenceState] = {}
        # Terminal records are dropped from _live (no unbounded growth) but their final
        # state is remembered for a while so a late cancel answers ALREADY_TERMINAL.
        self._recent: OrderedDict[RequestId, RequestState] = OrderedDict()
        self._remember = remember_terminal
        self._on_terminal = on_terminal
        self.terminal_events = 0

    # -- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._live

    def __iter__(self) -> Iterator[SequenceState]:
        return iter(list(self._live.values()))

    def get(self, request_id: RequestId) -> SequenceState | None:
        """The live record, or None when unknown or already terminal."""
        return self._live.get(request_id)

    def final_state(self, request_id: RequestId) -> RequestState | None:
        """Terminal state of a recently finished request, None if live or forgotten."""
        return self._recent.get(request_id)

    def counts(self) -> dict[RequestState, int]:
        """Number of live requests per state (000 §16 gauges)."""
        out: dict[RequestState, int] = {}
        for seq in self._live.values():
            out[seq.state] = out.get(seq.state, 0) + 1
        return out

    # -- transitions -------------------------------------------------------------------------

    def create(self, request_id: RequestId, tenant: TenantId, now: float) -> SequenceState:
        """Register a new request in state New. Request ids are server-assigned, so a duplicate is a bug."""
        if request_id in self._live or request_id in self._recent:
            raise InvariantViolation(f"request id {request_id!r} is already registered")
        seq = SequenceState(request_id=request_id, tenant=tenant, arrived_at=now, state_since=now)
        self._live[request_id] = seq
        return seq

    def move(self, seq: SequenceState, to: RequestState, now: float) -> None:
        """A non-terminal transition, checked against the 000 §2 table."""
        if to in TERMINAL_STATES:
            raise IllegalTransition(f"{seq.request_id}: use finish() to enter {to.value}")
        self._check_owned(seq)
        if to not in ALLOWED_TRANSITIONS[seq.state]:
            raise IllegalTransition(f"{seq.request_id}: {seq.state.value} -> {to.value} is not allowed")
        seq.state = to
        seq.state_since = now

    def start_job(self, seq: SequenceState, job: JobId, generation: ModelGenerationId, now: float) -> None:
        """Ready -> Running, tagging the request with the job and generation its completion must carry."""
        if seq.state is RequestState.PREFILL_READY:
            to = RequestState.PREFILL_RUNNING
        elif seq.state is RequestState.DECODE_READY:
            to = RequestState.DECODE_RUNNING
        else:
            raise IllegalTransition(f"{seq.request_id}: cannot start a job from {seq.state.value}")
        if seq.generation is not None and seq.generation != generation:
            raise InvariantViolation(
                f"{seq.request_id}: pinned to generation {seq.generation}, job is for generation {generation}"
            )
        self._check_owned(seq)
        seq.generation = generation
        seq.current_job = job
        seq.last_job = job
        seq.state = to
        seq.state_since = now

    def start_batch(self, seqs: list[SequenceState], job: JobId, generation: ModelGenerationId, now: float) -> None:
        """:meth:`start_job` for every request of one decode batch (DecodeReady -> DecodeRunning), checked first."""
        live = self._live
        ready = RequestState.DECODE_READY
        for seq in seqs:
            if seq.state is not ready or live.get(seq.request_id) is not seq:
                raise IllegalTransition(f"{seq.request_id}: cannot join a decode batch from {seq.state.value}")
            if seq.generation != generation:
                raise InvariantViolation(f"{seq.request_id}: generation {seq.generation}, batch is {generation}")
        running = RequestState.DECODE_RUNNING
        for seq in seqs:
            seq.current_job = job
            seq.last_job = job
            seq.state = running
            seq.state_since = now

    def check_callback(self, request_id: RequestId, generation: ModelGenerationId, job: JobId) -> CallbackDisposition:
        """Classify a completion callback tagged (generation, job) for one request (000 §4 rule 4).

        On ACCEPT or CANCEL_DRAINED the request's current job is cleared; the caller
        then moves it on (``move``/``finish``). STALE changes nothing.
        """
        seq = self._live.get(request_id)
        if seq is None or seq.state not in RUNNING_STATES:
            return CallbackDisposition.STALE
        if seq.generation != generation or seq.current_job != job:
            return CallbackDisposition.STALE
        seq.current_job = None
        if seq.cancel_requested:
            return CallbackDisposition.CANCEL_DRAINED
        return CallbackDisposition.STOP_DRAINED if seq.stop_requested else CallbackDisposition.ACCEPT

    def detach_job(self, seq: SequenceState) -> JobId | None:
        """Forget the job holding a Running request because that job was retired (timeout, reset).

        Its completion, if it ever comes, is then STALE. The caller must already have
        quarantined the job's KV lanes (Unknown) before finishing the request.
        """
        self._check_owned(seq)
        job, seq.current_job = seq.current_job, None
        return job

    def cancel(self, request_id: RequestId, now: float) -> CancelOutcome:
        """Idempotent cancel (000 §4 rule 2). Immediate before the device has the request, a flag after."""
        seq = self._live.get(request_id)
        if seq is None:
            return CancelOutcome.ALREADY_TERMINAL if request_id in self._recent else CancelOutcome.UNKNOWN
        if seq.state in IMMEDIATELY_CANCELLABLE:
            self.finish(seq, RequestState.CANCELLED, EndReason.CANCELLED, now, detail="cancelled by client")
            return CancelOutcome.CANCELLED
        if seq.state in RUNNING_STATES:
            if seq.cancel_requested:
                return CancelOutcome.ALREADY_REQUESTED
            seq.cancel_requested = True
            return CancelOutcome.FLAGGED
        return CancelOutcome.ALREADY_FINISHING  # FINISHING: the output is complete

    def stop(self, request_id: RequestId, now: float) -> CancelOutcome:
        """A stop string matched in the output already streamed: end the request as Completed/STOP.

        Immediate when no job holds the request (DecodeReady -> Finishing -> Completed); a flag while
        one does (the job drains, its lane result is discarded, then Completed). Before any output a stop
        cannot have matched, so it is a cancel. Idempotent like :meth:`cancel`, whose outcomes it returns.
        """
        seq = self._live.get(request_id)
        if seq is None:
            return CancelOutcome.ALREADY_TERMINAL if request_id in self._recent else CancelOutcome.UNKNOWN
        if seq.state is RequestState.DECODE_READY:
            self.move(seq, RequestState.FINISHING, now)
            self.finish(seq, RequestState.COMPLETED, EndReason.STOP, now, detail="stop string")
            return CancelOutcome.CANCELLED
        if seq.state in IMMEDIATELY_CANCELLABLE:
            return self.cancel(request_id, now)
        if seq.state in RUNNING_STATES:
            if seq.cancel_requested or seq.stop_requested:
                return CancelOutcome.ALREADY_REQUESTED
            seq.stop_requested = True
            return CancelOutcome.FLAGGED
        return CancelOutcome.ALREADY_FINISHING

    def finish(
        self,
        seq: SequenceState,
        state: RequestState,
        reason: EndReason,
        now: float,
        *,
        detail: str = "",
        retry_after_s: float | None = None,
    ) -> bool:
        """Enter a terminal state once (000 §4 rule 3). Returns False, changing nothing, if already terminal.

        Running requests cannot be finished here: their job must drain first (the
        caller gets the callback, then finishes); doing otherwise would free a lane
        the device may still be writing.
        """
        if state not in TERMINAL_STATES:
            raise IllegalTransition(f"{seq.request_id}: {state.value} is not a terminal state")
        if seq.state in TERMINAL_STATES or self._live.get(seq.request_id) is not seq:
            return False
        if seq.current_job is not None:
            raise InvariantViolation(
                f"{seq.request_id}: cannot finish while job {seq.current_job} still holds it (000 §4: drain first)"
            )
        if state not in ALLOWED_TRANSITIONS[seq.state]:
            raise IllegalTransition(f"{seq.request_id}: {seq.state.value} -> {state.value} is not allowed")
        previous = seq.state
        seq.state = state
        seq.state_since = now
        del self._live[seq.request_id]
        if self._remember:
            self._recent[seq.request_id] = state
            if len(self._recent) > self._remember:
                self._recent.popitem(last=False)
        self.terminal_events += 1
        event = TerminalEvent(
            request_id=seq.request_id,
            tenant=seq.tenant,
            state=state,
            reason=reason,
            detail=detail,
            at=now,
            generation=seq.generation,
            job_id=seq.last_job,
            prompt_tokens=seq.prompt_tokens,
            generated_tokens=seq.generated_tokens,
            retry_after_s=retry_after_s,
        )
        if self._on_terminal is not None:
            self._on_terminal(seq, event, previous)
        return True

    def _check_owned(self, seq: SequenceState) -> None:
        if self._live.get(seq.request_id) is not seq:
            raise InvariantViolation(f"{seq.request_id}: record is not live in this registry")
