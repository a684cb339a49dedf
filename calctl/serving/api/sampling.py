"""The request's sampling parameters as the engine takes them (:class:`~calctl.serving.protocol.SamplingParams`).

The schemas (``calctl.serving.api.schemas``) check each field's type and range; this module adds what needs the
alias's tokenizer: a ``logit_bias`` id outside the vocabulary is a 400 naming the id (OpenAI answers the same).
No HTTP framework beyond the error response, no engine.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from calctl.serving.api.errors import invalid
from calctl.serving.api.schemas import ChatCompletionRequest, CompletionRequest
from calctl.serving.protocol import SamplingParams


def logprobs_asked(body: CompletionRequest | ChatCompletionRequest) -> int | None:
    """How many alternatives per token the body asks for (None: no log-probabilities at all)."""
    if isinstance(body, ChatCompletionRequest):
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def sampling_params(
    body: CompletionRequest | ChatCompletionRequest, vocab_size: int, model: str
) -> SamplingParams | JSONResponse:
    """The engine's parameters of ``body``, or the 400 for a ``logit_bias`` id the model's vocabulary lacks."""
    bias: list[tuple[int, float]] = []
    for key, value in (body.logit_bias or {}).items():
        token = int(key)
        if token >= vocab_size:
            return invalid(
                f"logit_bias: token id {key} is outside the vocabulary of {model!r} ({vocab_size} entries)",
                param="logit_bias",
            )
        bias.append((token, float(value)))
    if len({t for t, _ in bias}) != len(bias):  # "5" and "05" name one token: which bias was meant?
        return invalid("logit_bias names one token id twice (e.g. '5' and '05')", param="logit_bias")
    return SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        top_k=body.top_k,
        min_p=body.min_p,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        repetition_penalty=body.repetition_penalty,
        logit_bias=tuple(sorted(bias)),
        logprobs=logprobs_asked(body),
    )


__all__ = ["logprobs_asked", "sampling_params"]
