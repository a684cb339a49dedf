"""What the HTTP layer needs from the engine, and nothing more.

The API speaks OpenAI JSON on one side and these types on the other; the engine
(``calctl.serving.engine``) implements :class:`EngineClient` (vLLM's name for the same seam). Keeping the seam this
narrow lets the API be tested against a fake engine and lets the engine be
driven by the soak and bench tools without HTTP.

No FastAPI, no runtime and no scheduling logic here.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from calctl.serving.text import TextCodec


class RejectCode(str, enum.Enum):
    """Why a request was refused before any token; the value is the OpenAI error ``code``.

    Its HTTP status and error type are in :mod:`calctl.serving.outcomes` (the one table)."""

    INVALID = "invalid_request_error"  # RejectInvalid (000 §5.2)
    MODEL_NOT_FOUND = "model_not_found"
    CAPACITY = "rate_limit_exceeded"  # RejectCapacity
    UNAVAILABLE = "model_unavailable"  # RejectUnavailable (draining, recovering, failed, loading)
    DEADLINE = "deadline_exceeded"  # the request expired after admission, before its first token


class EngineRejection(Exception):
    def __init__(
        self, code: RejectCode, message: str, *, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s


SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it samples greedily


@dataclass(frozen=True)
class SamplingParams:
    """How one request's tokens are chosen (``calctl.serving.engine.sampling`` applies them, in vLLM's order).

    The defaults change nothing: ``top_k`` 0 (or -1) and ``min_p`` 0 keep every token, penalties 0 (1 for
    ``repetition_penalty``) and an empty ``logit_bias`` leave the logits as the model gave them. ``logprobs``
    None asks for none; ``n`` (0..20) asks for the sampled token's log-probability and the ``n`` most likely.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids unique
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        """Below vLLM's ``_SAMPLING_EPS`` a temperature is 0: dividing by 1e-310 overflowed the logits to
        infinity and the draw failed on NaN probabilities, in the engine's thread."""
        return self.temperature < SAMPLING_EPS


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the model's raw distribution (log-softmax of the logits as
    the model produced them, vLLM's default ``raw_logprobs``), and the ``top`` most likely (id, logprob), best
    first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    alias: str
    tenant: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    timeout_s: float | None = None  # client-requested deadline; the server default may only be lowered
    ignore_eos: bool = False
    # The request's stop strings. The API layer matches them in the text and ends the request (``finish``);
    # the engine needs them only to record ``stop``, as the client was told, when the token that completed
    # one was also the last ``max_tokens`` allowed (001 §14; the record said ``length``).
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """A request refused before any token, as its 001 §14 record and ``calctl_requests_total`` name it."""

    request_id: str
    alias: str
    tenant: str
    prompt_tokens: int | None  # None: refused before its prompt was counted
    rejection: EngineRejection


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS token or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    CANCELLED = "cancelled"  # client left or DELETE /internal/requests/{id}
    ERROR = "error"  # device fault; the message says which


@dataclass(frozen=True)
class TokenEvent:
    """One generated token, or the end of the stream (``finish`` set, token may be None)."""

    token_id: int | None
    finish: FinishReason | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The ModelGeneration whose device job produced this token (000 §10, 001 §13.1 "no completion from an
    # old generation is delivered"). Filled by the alias's engine core; None from engines that do not tag
    # tokens. The soak checks it against the generation the request was admitted under (docs/soak.md).
    generation: int | None = None
    # On the terminal event: the engine's :class:`calctl.serving.outcomes.EngineOutcome` value (``stop``,
    # ``deadline``, ``device_error``, ...), so a client classifies an error without parsing its text.
    outcome: str | None = None
    # The token's log-probabilities, when the request asked for them (``SamplingParams.logprobs``).
    logprob: TokenLogprob | None = None


class RequestStream(Protocol):
    request_id: str

    async def admitted(self) -> None:
        """Return once the request is admitted; raise EngineRejection if it is refused or expires queued."""

    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...

    def cancel(self, reason: str = "cancelled") -> None:
        """Idempotent; the request stops being served, its resources are reclaimed when its job drains."""

    def finish(self, reason: FinishReason) -> None:
        """End early on the caller's decision (a stop string matched); not counted as a cancellation."""


@dataclass(frozen=True)
class ModelInfo:
    alias: str
    state: str
    generation: int | None
    context_limit: int
    created: int


class EngineClient(Protocol):
    def codec(self, alias: str) -> TextCodec:
        """The alias's text codec; raises EngineRejection(MODEL_NOT_FOUND) for an unknown alias."""

    def context_limit(self, alias: str) -> int: ...

    def models(self) -> list[ModelInfo]:
        """Every configured alias with its lifecycle state."""

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Validate and reserve admission atomically; raise EngineRejection for an immediate refusal."""

    def refused(self, refusal: Refusal) -> None:
        """A request the HTTP layer refused (its 400, or the 404 of a model it does not serve): recorded as the
        engine's own refusals are (001 §14), and counted for a served alias only (no unbounded metric labels)."""

    def cancel(self, request_id: str) -> bool: ...

    def is_ready(self, alias: str | None = None) -> bool: ...

    def is_draining(self) -> bool: ...

    def failures(self) -> dict[str, str]: ...

    async def admin(self, alias: str, action: str, package: str | None = None) -> Mapping[str, Any]:
        """load | unload | reload | rollback, run on the supervisor; returns a JSON-able outcome. ``package``
        (load, reload): the path the request names; refused (EngineRejection INVALID) unless allowed."""

    async def executor(self, alias: str, mode: str | None = None) -> Mapping[str, Any]:
        """The alias's executor status; with ``mode`` (sync | async | pingpong), set it first (an operator
        action, 000 §14). ``ok`` is False when the configuration does not allow the mode."""

    def metrics_text(self) -> bytes:
        """Prometheus text exposition of every metric family."""

    def trace(self, since_ns: int = 0) -> Mapping[str, Any]:
        """The device's per-chip job intervals since ``since_ns`` (internal: it names chips)."""

    def status(self) -> Mapping[str, Any]:
        """Model states, generations, failures and recoveries for ``GET /internal/status`` (internal)."""
