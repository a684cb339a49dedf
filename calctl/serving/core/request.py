"""Request states, the per-request record and the events a request emits (000 §2, §4).

:class:`SequenceState` is the 000 §2 struct of the same name: one mutable
record per request, owned by :class:`~calctl.serving.core.registry.RequestRegistry`
and mutated only through it and the scheduler that holds the registry. The
values that leave the core (:class:`TerminalEvent`, :class:`CancelOutcome`,
:class:`EndReason`) are frozen.

This module has no behaviour beyond the transition table; it does not decide
when a request moves, and it keeps no prompt or output text (the engine does).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from calctl.serving.core.enums import IdentityEnum
from calctl.serving.core.ids import JobId, LaneId, ModelGenerationId, RequestId, TenantId


class RequestState(IdentityEnum):
    """The eleven request states of 000 §2 ``RequestState``."""

    NEW = "New"
    WAITING_MODEL = "WaitingModel"
    WAITING_ADMISSION = "WaitingAdmission"
    PREFILL_READY = "PrefillReady"
    PREFILL_RUNNING = "PrefillRunning"
    DECODE_READY = "DecodeReady"
    DECODE_RUNNING = "DecodeRunning"
    FINISHING = "Finishing"
    COMPLETED = "Completed"
    CANCELLED = "Cancelled"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def running(self) -> bool:
        """A device job holds this request; cancel can only flag it (000 §4)."""
        return self in RUNNING_STATES


TERMINAL_STATES = frozenset({RequestState.COMPLETED, RequestState.CANCELLED, RequestState.FAILED})
RUNNING_STATES = frozenset({RequestState.PREFILL_RUNNING, RequestState.DECODE_RUNNING})
# 000 §4: "New/Waiting/Ready 可立即完成取消".
IMMEDIATELY_CANCELLABLE = frozenset(
    {
        RequestState.NEW,
        RequestState.WAITING_MODEL,
        RequestState.WAITING_ADMISSION,
        RequestState.PREFILL_READY,
        RequestState.DECODE_READY,
    }
)

_S = RequestState
# The one transition table (000 §2, 001 §9.1: Queued -> PrefillReady -> PrefillRunning ->
# DecodeReady -> DecodeRunning -> DecodeReady ... -> Completed). Terminal states have no exits.
ALLOWED_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    _S.NEW: frozenset({_S.WAITING_MODEL, _S.WAITING_ADMISSION, _S.PREFILL_READY, _S.CANCELLED, _S.FAILED}),
    _S.WAITING_MODEL: frozenset({_S.WAITING_ADMISSION, _S.PREFILL_READY, _S.CANCELLED, _S.FAILED}),
    _S.WAITING_ADMISSION: frozenset({_S.WAITING_MODEL, _S.PREFILL_READY, _S.CANCELLED, _S.FAILED}),
    _S.PREFILL_READY: frozenset({_S.PREFILL_RUNNING, _S.CANCELLED, _S.FAILED}),
    _S.PREFILL_RUNNING: frozenset({_S.DECODE_READY, _S.FINISHING, _S.CANCELLED, _S.FAILED}),
    # DecodeReady -> Finishing: a stop string matched in the output already streamed (000 §2 Finishing).
    _S.DECODE_READY: frozenset({_S.DECODE_RUNNING, _S.FINISHING, _S.CANCELLED, _S.FAILED}),
    _S.DECODE_RUNNING: frozenset({_S.DECODE_READY, _S.FINISHING, _S.CANCELLED, _S.FAILED}),
    _S.FINISHING: frozenset({_S.COMPLETED, _S.FAILED}),
    _S.COMPLETED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.FAILED: frozenset(),
}


class EndReason(enum.Enum):
    """Why a request reached its terminal state. ``calctl.serving.outcomes`` maps each to the protocol's
    finish reason, the HTTP status and the metric outcome; the core carries no HTTP numbers."""

    STOP = "stop"  # EOS, or a stop string the engine found in the text (Completed)
    LENGTH = "length"  # max_tokens reached (Completed)
    CANCELLED = "cancelled"  # client or operator cancel (Cancelled)
    DEADLINE = "deadline"  # deadline expired before completion (Failed)
    REJECTED_INVALID = "rejected_invalid"  # 000 §5.2 RejectInvalid
    REJECTED_CAPACITY = "rejected_capacity"  # 000 §5.2 RejectCapacity
    REJECTED_UNAVAILABLE = "rejected_unavailable"  # 000 §5.2 RejectUnavailable
    DEVICE_ERROR = "device_error"  # the job failed or faulted on the device (000 §7.4)
    GENERATION_RETIRED = "generation_retired"  # the model generation was reset/unloaded (000 §10, §12)
    INTERNAL = "internal"  # the core refused a lane before submit (000 §7.4)


class CancelOutcome(enum.Enum):
    """Result of :meth:`RequestRegistry.cancel`; every value is a success (cancel is idempotent, 000 §4)."""

    CANCELLED = "cancelled"  # was New/Waiting/Ready: terminal now
    FLAGGED = "flagged"  # was Running: terminal when the job drains
    ALREADY_REQUESTED = "already_requested"  # flagged earlier, still draining
    ALREADY_FINISHING = "already_finishing"  # output complete, terminal imminent; nothing to cancel
    ALREADY_TERMINAL = "already_terminal"
    UNKNOWN = "unknown"  # never seen, or terminal long enough ago to be forgotten


class CallbackDisposition(enum.Enum):
    """What a tagged completion callback means for its request (000 §4)."""

    ACCEPT = "accept"  # matches the request's generation and current job: apply it
    CANCEL_DRAINED = "cancel_drained"  # matches, but cancel was flagged while running: finish as Cancelled
    STOP_DRAINED = "stop_drained"  # matches, but a stop string ended it while running: finish as Completed
    STALE = "stale"  # old generation/job or request gone: drop it (resources are still reclaimed)


@dataclass(slots=True, eq=False)
class SequenceState:
    """One request's live record (000 §2 ``SequenceState``, 001 §10.2 ``RequestContext``).

    Mutated only by the registry and its scheduler. ``kv_lane`` is the lane the
    KV manager reserved at admission; the KV lengths themselves live in the KV
    manager (single source of truth, 000 §9.1), not here.
    """

    request_id: RequestId
    tenant: TenantId
    arrived_at: float
    state: RequestState = RequestState.NEW
    state_since: float = 0.0
    generation: ModelGenerationId | None = None
    deadline: float = math.inf
    prompt_tokens: int = 0
    max_new_tokens: int = 0
    generated_tokens: int = 0
    kv_lane: LaneId | None = None
    virtual_start: float = 0.0
    virtual_finish: float = 0.0
    last_token: int | None = None
    current_job: JobId | None = None  # the job that holds the request now (Running states only)
    last_job: JobId | None = None
    cancel_requested: bool = False
    stop_requested: bool = False  # a stop string matched while a job held the request: Completed on drain
    queue_token: int = -1  # the live scheduler-queue entry of this request (lazy deletion)


@dataclass(frozen=True, slots=True)
class TerminalEvent:
    """Emitted exactly once per request, when it enters Completed, Cancelled or Failed (000 §4)."""

    request_id: RequestId
    tenant: TenantId
    state: RequestState
    reason: EndReason
    detail: str
    at: float
    generation: ModelGenerationId | None
    job_id: JobId | None
    prompt_tokens: int
    generated_tokens: int
    retry_after_s: float | None = None  # a hint for a refused request (Retry-After)
