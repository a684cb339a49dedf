"""The one generator of text deltas over an engine stream, shared by the collecting and the SSE paths.

It does what a real server does with a model's tokens (issue 17 item 3):

* the EOS token ends the output and is never text (``finish_reason: "stop"``);
* every delta is whole UTF-8 characters: a character split across tokens is held
  until the token that completes it (:class:`~calctl.serving.text.IncrementalDetokenizer`);
* a stop string is found across token boundaries and never sent
  (:class:`~calctl.serving.text.OutputText`, which the engine's records use too); the engine is told, and ends the
  request as Completed with finish reason ``stop`` (a real finish, not a cancel);
* ``usage`` counts the model's tokens, as the engine reports them, less the EOS
  token that ended the output: ``completion_tokens`` counts what OpenAI and
  llama.cpp count (the text's tokens), not the end-of-sequence marker;
* a delta carries the log-probabilities of the tokens it covers (when the request
  asked for them), so they count what ``usage`` counts: the EOS that ended the
  output is left out.

No HTTP here: the endpoints turn :class:`Delta` values into JSON or SSE chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from calctl.serving.outcomes import ENDINGS
from calctl.serving.protocol import FinishReason, RequestStream, TokenEvent, TokenLogprob
from calctl.serving.text import OutputText, TextCodec

#: The OpenAI ``finish_reason`` of each protocol finish reason.
FINISH_NAMES = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.ERROR: "error",
}
assert {e.finish for e in ENDINGS.values()} <= set(FINISH_NAMES)


@dataclass(frozen=True)
class Delta:
    """Text to send now; on the last delta ``finish`` is set (and ``error`` when generation failed)."""

    text: str
    usage: dict[str, int]
    finish: str | None = None
    error: str | None = None  # the engine's own text: for the log, never for the client (001 §10.1)
    outcome: str | None = None  # calctl.serving.outcomes.EngineOutcome value of a failed stream
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens since the previous delta (none unless asked for)


def usage_of(ev: TokenEvent) -> dict[str, int]:
    return {
        "prompt_tokens": ev.prompt_tokens,
        "completion_tokens": ev.completion_tokens,
        "total_tokens": ev.prompt_tokens + ev.completion_tokens,
    }


async def text_deltas(
    stream: RequestStream, codec: TextCodec, stops: Sequence[str], *, prompt_ids: Sequence[int] = ()
) -> AsyncIterator[Delta]:
    """Text deltas of ``stream``; the last one carries the finish reason. Empty deltas are not yielded."""
    text = OutputText(codec, stops, context=prompt_ids)
    eos = codec.eos_token_id
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": 0, "total_tokens": len(prompt_ids)}
    ended_by_eos = False  # the last token was the EOS: a stop then does not count it (no text, not billed)
    pending: list[TokenLogprob] = []  # log-probabilities of tokens not yet in a delta

    def taken() -> tuple[TokenLogprob, ...]:
        out = tuple(pending)
        pending.clear()
        return out

    async for ev in stream:
        usage = usage_of(ev)
        if ev.token_id is not None:
            ended_by_eos = ev.token_id == eos
            if ev.logprob is not None:
                pending.append(ev.logprob)
        if ended_by_eos and ev.finish is FinishReason.STOP and usage["completion_tokens"]:
            usage = {
                **usage,
                "completion_tokens": usage["completion_tokens"] - 1,
                "total_tokens": usage["total_tokens"] - 1,
            }
            if pending and pending[-1].token_id == eos:
                pending.pop()  # the EOS that ended the output: not text, not counted
        if ev.token_id is not None and ev.token_id != eos:
            safe, stopped = text.push(ev.token_id)
            if stopped:
                # Stop reading here: after finish() the engine may still deliver a token already in flight,
                # or nothing at all, so waiting for more would hang.
                stream.finish(FinishReason.STOP)
                yield Delta(safe, usage, "stop", logprobs=taken())
                return
            if safe:
                yield Delta(safe, usage, logprobs=taken())
        if ev.finish is not None:
            if ev.finish is FinishReason.ERROR:
                yield Delta("", usage, "error", error=ev.error or "device error", outcome=ev.outcome)
                return
            tail, stopped = text.end()
            yield Delta(tail, usage, "stop" if stopped else FINISH_NAMES[ev.finish], logprobs=taken())
            return
    # The stream ended without a terminal event (an engine that stopped after finish()): what was held is sent.
    tail, stopped = text.end()
    yield Delta(tail, usage, "stop" if stopped else "length", logprobs=taken())


__all__ = ["FINISH_NAMES", "Delta", "text_deltas", "usage_of"]
