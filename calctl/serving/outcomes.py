"""The one outcome table: how a request ended, in every vocabulary that reports it (000 §4, §5.2; 001 §10.1).

The serving core says *why* a request ended (:class:`calctl.serving.core.request.EndReason`)
or was refused (:class:`calctl.serving.core.admission.AdmissionDecision`) and nothing else: no
HTTP numbers, no OpenAI strings. This module is the only place that turns those
into what the outside sees:

* the protocol's finish reason on the stream (:class:`calctl.serving.protocol.FinishReason`),
  or the rejection code when no output was produced yet (:class:`calctl.serving.protocol.RejectCode`);
* the HTTP status, and the OpenAI error ``type`` and ``code`` of the error body;
* the ``outcome`` label of ``calctl_requests_total`` (:class:`EngineOutcome`);
* the client-side class a soak or bench report counts (:class:`RequestOutcome`).

"Where does a 429 come from" is answered in :mod:`calctl.serving.core.admission`, which decides every
``REJECT_CAPACITY``; here :data:`REJECTIONS` only gives it its number (``RejectCode.CAPACITY`` -> 429),
reached through :data:`DECISION_REJECTION`.

Nothing here decides anything; it only translates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from calctl.serving.core.admission import END_OF_REFUSAL, AdmissionDecision
from calctl.serving.core.request import EndReason
from calctl.serving.protocol import FinishReason, RejectCode


class EngineOutcome(str, enum.Enum):
    """How a request ended, as the engine counts it: the ``outcome`` label of ``calctl_requests_total``.

    A fixed set, so the label stays bounded (000 §16)."""

    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    CANCELLED = "cancelled"  # the client left, or DELETE /internal/requests/{id}
    DEADLINE = "deadline"  # the request's own deadline expired after admission (queued for admission: capacity)
    INVALID = "invalid"  # 400 before any token
    MODEL_NOT_FOUND = "model_not_found"  # 404
    CAPACITY = "capacity"  # 429
    UNAVAILABLE = "unavailable"  # 503: loading, draining, recovering, failed, shutting down
    DEVICE_ERROR = "device_error"  # the job failed or faulted on the device
    GENERATION_RETIRED = "generation_retired"  # the generation was reset or unloaded under the request
    INTERNAL = "internal"  # the engine refused the work (a lane before submit, a bug in the loop)


class RequestOutcome(str, enum.Enum):
    """How a request ended from the client's side, by class (soak and bench reports, both transports)."""

    OK = "ok"  # finished: stop (EOS or a stop string) or length
    CANCELLED = "cancelled"  # the client cancelled it (intended by the workload)
    INVALID = "invalid"  # 400 before any token
    NOT_FOUND = "not_found"  # 404 unknown model
    CAPACITY = "capacity"  # 429
    UNAVAILABLE = "unavailable"  # 503: draining, loading, recovering, failed
    DEADLINE = "deadline"  # the request's own deadline expired (queued or running)
    DEVICE_ERROR = "device_error"  # admitted, then the generation failed (an error after the first byte)
    TIMEOUT = "timeout"  # the client gave up waiting: no terminal event within its limit
    TRANSPORT = "transport"  # connection or protocol error (HTTP only)

    @property
    def is_error(self) -> bool:
        """Not what the client asked for. Cancellations are the workload's own choice."""
        return self not in (RequestOutcome.OK, RequestOutcome.CANCELLED)


@dataclass(frozen=True)
class Rejection:
    """A request refused (or ended) before its first token: one HTTP error response."""

    code: RejectCode  # the OpenAI error ``code`` is ``code.value``
    http_status: int
    error_type: str  # the OpenAI error ``type``
    outcome: EngineOutcome
    client: RequestOutcome


#: RejectCode -> the HTTP error it is. The OpenAI spelling throughout (type ``invalid_request_error``).
REJECTIONS: dict[RejectCode, Rejection] = {
    r.code: r
    for r in (
        Rejection(RejectCode.INVALID, 400, "invalid_request_error", EngineOutcome.INVALID, RequestOutcome.INVALID),
        Rejection(
            RejectCode.MODEL_NOT_FOUND,
            404,
            "invalid_request_error",
            EngineOutcome.MODEL_NOT_FOUND,
            RequestOutcome.NOT_FOUND,
        ),
        Rejection(RejectCode.CAPACITY, 429, "rate_limit_error", EngineOutcome.CAPACITY, RequestOutcome.CAPACITY),
        Rejection(
            RejectCode.UNAVAILABLE, 503, "service_unavailable", EngineOutcome.UNAVAILABLE, RequestOutcome.UNAVAILABLE
        ),
        Rejection(RejectCode.DEADLINE, 503, "service_unavailable", EngineOutcome.DEADLINE, RequestOutcome.DEADLINE),
    )
}


@dataclass(frozen=True)
class Ending:
    """One core finish reason: what the stream says once output began, and the rejection before it did."""

    reason: EndReason
    outcome: EngineOutcome
    finish: FinishReason  # TokenEvent.finish when the request had produced output
    before_output: RejectCode | None  # the HTTP error when it had not (None: a normal end, e.g. a cancel)
    client: RequestOutcome


#: The core's EndReason -> everything else. Exhaustive: a test checks every member has a row.
ENDINGS: dict[EndReason, Ending] = {
    e.reason: e
    for e in (
        Ending(EndReason.STOP, EngineOutcome.STOP, FinishReason.STOP, None, RequestOutcome.OK),
        Ending(EndReason.LENGTH, EngineOutcome.LENGTH, FinishReason.LENGTH, None, RequestOutcome.OK),
        Ending(EndReason.CANCELLED, EngineOutcome.CANCELLED, FinishReason.CANCELLED, None, RequestOutcome.CANCELLED),
        Ending(
            EndReason.DEADLINE, EngineOutcome.DEADLINE, FinishReason.ERROR, RejectCode.DEADLINE, RequestOutcome.DEADLINE
        ),
        Ending(
            EndReason.REJECTED_INVALID,
            EngineOutcome.INVALID,
            FinishReason.ERROR,
            RejectCode.INVALID,
            RequestOutcome.INVALID,
        ),
        Ending(
            EndReason.REJECTED_CAPACITY,
            EngineOutcome.CAPACITY,
            FinishReason.ERROR,
            RejectCode.CAPACITY,
            RequestOutcome.CAPACITY,
        ),
        Ending(
            EndReason.REJECTED_UNAVAILABLE,
            EngineOutcome.UNAVAILABLE,
            FinishReason.ERROR,
            RejectCode.UNAVAILABLE,
            RequestOutcome.UNAVAILABLE,
        ),
        Ending(
            EndReason.DEVICE_ERROR,
            EngineOutcome.DEVICE_ERROR,
            FinishReason.ERROR,
            RejectCode.UNAVAILABLE,
            RequestOutcome.DEVICE_ERROR,
        ),
        Ending(
            EndReason.GENERATION_RETIRED,
            EngineOutcome.GENERATION_RETIRED,
            FinishReason.ERROR,
            RejectCode.UNAVAILABLE,
            RequestOutcome.DEVICE_ERROR,
        ),
        Ending(
            EndReason.INTERNAL,
            EngineOutcome.INTERNAL,
            FinishReason.ERROR,
            RejectCode.UNAVAILABLE,
            RequestOutcome.DEVICE_ERROR,
        ),
    )
}

#: Admission verdicts that refuse a request -> their rejection code (000 §5.2): the ending each refusal
#: has in the core (``END_OF_REFUSAL``), as the client hears it before any output.
DECISION_REJECTION: dict[AdmissionDecision, RejectCode] = {
    d: code for d, end in END_OF_REFUSAL.items() if (code := ENDINGS[end].before_output) is not None
}

#: What a client is told when generation fails after output began. The engine's own text may name a chip,
#: a core, an address or a file, which public responses never show (001 §10.1); it goes to the log.
PUBLIC_ERROR: dict[EngineOutcome, tuple[str, str]] = {
    EngineOutcome.DEADLINE: ("deadline_exceeded", "the request's deadline expired while generating this response"),
    EngineOutcome.DEVICE_ERROR: ("device_error", "the model failed while generating this response; retry the request"),
    EngineOutcome.GENERATION_RETIRED: (
        "device_error",
        "the model failed while generating this response; retry the request",
    ),
    EngineOutcome.INTERNAL: ("internal_error", "internal error while generating this response; retry the request"),
}
DEFAULT_PUBLIC_ERROR = ("device_error", "the model failed while generating this response; retry the request")

#: The message of a request refused for these outcomes before its first token (its status and code come
#: from :data:`ENDINGS`); the engine's own detail goes to the log only. Other outcomes (capacity, invalid,
#: draining) keep the core's text, which names only the alias and the numbers.
PUBLIC_BEFORE_OUTPUT: dict[EngineOutcome, str] = {
    EngineOutcome.DEADLINE: "the request's deadline expired before its first token",
    EngineOutcome.DEVICE_ERROR: "the model failed before this request's first token; retry the request",
    EngineOutcome.GENERATION_RETIRED: "the model was reset before this request's first token; retry the request",
    EngineOutcome.INTERNAL: "internal error before this request's first token; retry the request",
}
DEFAULT_BEFORE_OUTPUT = "the model failed before this request's first token; retry the request"

#: The client's class of a stream that ended in error after output began, by the engine's outcome.
_CLIENT_OF_OUTCOME: dict[str, RequestOutcome] = {e.outcome.value: e.client for e in ENDINGS.values()}


def public_before_output(outcome: EngineOutcome, detail: str) -> str:
    """The client's message for a request refused before output: :data:`PUBLIC_BEFORE_OUTPUT`, else ``detail``."""
    return PUBLIC_BEFORE_OUTPUT.get(outcome, detail)


def ending(reason: EndReason) -> Ending:
    return ENDINGS[reason]


def rejection(code: RejectCode) -> Rejection:
    return REJECTIONS[code]


def public_error(outcome: str | None, generated_tokens: int | None = None) -> tuple[str, str]:
    """(OpenAI error code, message) for a request that failed after admission, by :class:`EngineOutcome` value.

    ``generated_tokens`` 0: it failed before its first token (an admitted request whose deadline passed while
    its prefill ran), so the message is :data:`PUBLIC_BEFORE_OUTPUT`'s, as docs/serve.md promises; the code
    stays the one a failure after output gets (``deadline_exceeded``, ``device_error``)."""
    try:
        kind = EngineOutcome(outcome)
    except ValueError:
        kind = None
    code, message = PUBLIC_ERROR.get(kind, DEFAULT_PUBLIC_ERROR) if kind is not None else DEFAULT_PUBLIC_ERROR
    if generated_tokens == 0:
        message = PUBLIC_BEFORE_OUTPUT.get(kind, DEFAULT_BEFORE_OUTPUT) if kind is not None else DEFAULT_BEFORE_OUTPUT
    return code, message


def http_status_of_decision(verdict: AdmissionDecision) -> int | None:
    """The HTTP status an admission verdict answers with; None for Admit/Queue (the response is the output)."""
    code = DECISION_REJECTION.get(verdict)
    return None if code is None else REJECTIONS[code].http_status


def http_status_of_end(reason: EndReason, generated_tokens: int) -> int | None:
    """The HTTP status of a request that ended for ``reason``: its error status when it ended before any
    output, None when output began (the status was 200 and the stream carries the end)."""
    code = ENDINGS[reason].before_output
    return None if code is None or generated_tokens else REJECTIONS[code].http_status


def client_outcome_of_rejection(code: RejectCode) -> RequestOutcome:
    return REJECTIONS[code].client


def client_outcome_of_end(finish: FinishReason, outcome: str | None) -> RequestOutcome:
    """The client's class of a stream's terminal event (``TokenEvent.finish`` and ``TokenEvent.outcome``)."""
    if finish is FinishReason.CANCELLED:
        return RequestOutcome.CANCELLED
    if finish is not FinishReason.ERROR:
        return RequestOutcome.OK
    return _CLIENT_OF_OUTCOME.get(outcome or "", RequestOutcome.DEVICE_ERROR)


def client_outcome_of_status(status: int, code: str | None = None) -> RequestOutcome:
    """An HTTP error response (status and the OpenAI error ``code``) as the client's class."""
    for r in REJECTIONS.values():
        if r.code.value == code and r.http_status == status:
            return r.client
    for r in REJECTIONS.values():  # a code we did not write (another server): the status decides
        if r.http_status == status and r.code in (
            RejectCode.INVALID,
            RejectCode.MODEL_NOT_FOUND,
            RejectCode.CAPACITY,
            RejectCode.UNAVAILABLE,
        ):
            return r.client
    return RequestOutcome.TRANSPORT


__all__ = [
    "DECISION_REJECTION",
    "ENDINGS",
    "PUBLIC_BEFORE_OUTPUT",
    "REJECTIONS",
    "Ending",
    "EngineOutcome",
    "Rejection",
    "RequestOutcome",
    "client_outcome_of_end",
    "client_outcome_of_rejection",
    "client_outcome_of_status",
    "ending",
    "http_status_of_decision",
    "http_status_of_end",
    "public_before_output",
    "public_error",
    "rejection",
]
