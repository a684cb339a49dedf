"""The OpenAI endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (001 §10.1).

* validation and admission finish before the first byte, so 400/404/429/503 are
  real HTTP statuses with OpenAI error bodies (000 §5.2);
* a client that disconnects, streaming or not, cancels its request (000 §4);
* an error after streaming started is an SSE ``error`` event and the stream is
  closed, never a silent truncation;
* the text comes from :func:`~calctl.serving.api.deltas.text_deltas` for both the
  collecting and the SSE responses, so they cannot disagree.

The engine does the work; this module only translates.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from calctl.serving import outcomes
from calctl.serving.api.auth import ApiSettings, Auth
from calctl.serving.api.bodies import Refused, encode_prompt, parse_body, refuse_long_ids
from calctl.serving.api.deltas import Delta, text_deltas
from calctl.serving.api.errors import error_body, error_response, invalid, rejection_response
from calctl.serving.api.guard import BODY_SCOPE_KEY
from calctl.serving.api.logprobs import LogprobShape, TokenNames
from calctl.serving.api.sampling import sampling_params
from calctl.serving.api.schemas import ChatCompletionRequest, CompletionRequest
from calctl.serving.api.workers import BIG_BODY, BIG_INPUT, INLINE_BODY, PromptWorkers, paced
from calctl.serving.protocol import (
    EngineClient,
    EngineRejection,
    GenerationRequest,
    ModelInfo,
    Refusal,
    RejectCode,
    RequestStream,
    SamplingParams,
    TokenLogprob,
)
from calctl.serving.text import ChatTemplateError, TextCodec

try:  # a C JSON encoder for the SSE chunks, one per token: ~15x the standard library's speed (docs/serve.md)
    import orjson
except ImportError:  # pragma: no cover - a dependency; the standard library does the same, slower
    orjson = None  # type: ignore[assignment]

T = TypeVar("T")
DISCONNECT_POLL_S = 0.05
log = logging.getLogger("calctl.serving.api")
INTERNAL_ERROR = ("internal_error", "internal error while generating this response; retry the request")


async def _race_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` but give up (raise CancelledError) if the client leaves first."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise asyncio.CancelledError("client disconnected")
    finally:
        if not task.done():
            task.cancel()


@dataclass
class _SseOutcome:
    done: bool = False  # the engine's stream ended, or this layer already released it


class _SseResponse(StreamingResponse):
    """An SSE response over one engine stream that releases the stream however the response ends (000 §4).

    The cancel cannot live in the body generator's ``finally`` alone: when the client leaves while a
    ``send()`` is blocked (it stopped reading), Starlette abandons the generator parked at a ``yield``
    without closing it, and when the client leaves before the first body byte the generator never runs;
    either way the request would go on generating for nobody until the garbage collector got round to it.
    """

    def __init__(
        self, content: AsyncGenerator[bytes, None], *, engine_stream: RequestStream, outcome: _SseOutcome, **kw: Any
    ) -> None:
        super().__init__(content, **kw)
        self._body = content
        self._engine_stream = engine_stream
        self._outcome = outcome

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._outcome.done:
                # The client left mid-stream (or the server is shutting down): 000 §4 cancel, exactly once.
                self._outcome.done = True
                self._engine_stream.cancel("client_disconnected")
            await self._body.aclose()  # run the generator's cleanup now, not at garbage collection


def _public_error(delta: Delta) -> tuple[str, str]:
    """(OpenAI error code, message) a client sees for a stream that failed after admission: the message says
    "before its first token" when it produced none (docs/serve.md), "while generating" otherwise."""
    return outcomes.public_error(delta.outcome, delta.usage.get("completion_tokens"))


def openai_router(engine: EngineClient, settings: ApiSettings, auth: Auth, workers: PromptWorkers) -> APIRouter:
    """The endpoints' routes; each handler is one call of :class:`OpenAIRoutes`."""
    routes = OpenAIRoutes(engine, settings, workers)
    router = APIRouter()
    by_key = Depends(auth.tenant)

    @router.get("/v1/models")
    async def list_models(_: str = by_key) -> dict[str, Any]:
        return routes.list_models()

    @router.get("/v1/models/{model_id:path}", response_model=None)
    async def retrieve_model(model_id: str, _: str = by_key) -> dict[str, Any] | Response:
        """The OpenAI ``models.retrieve``: a model ``/v1/models`` lists, else a 404 in OpenAI's error shape."""
        return routes.retrieve_model(model_id)

    @router.post("/v1/completions", response_model=None)
    async def completions(request: Request, tenant: str = by_key) -> Response:
        return await routes.serve(request, tenant, CompletionRequest, routes.completion_prompt, chat=False)

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request, tenant: str = by_key) -> Response:
        return await routes.serve(request, tenant, ChatCompletionRequest, routes.chat_prompt, chat=True)

    return router


def _model_entry(m: ModelInfo) -> dict[str, Any]:
    # max_model_len: vLLM's name for the context length a request may use (prompt + output), which
    # clients and harnesses already read; here it is what admission enforces (001 §10.4).
    return {
        "id": m.alias,
        "object": "model",
        "created": m.created,
        "owned_by": "calctl",
        "max_model_len": m.context_limit,
    }


@dataclass(frozen=True)
class _Prepared:
    """A request ready for the engine: its body, the model's codec, the prompt, ``max_tokens`` and sampling."""

    body: Any
    codec: TextCodec
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams


class OpenAIRoutes:
    """What the OpenAI endpoints do over one engine; the router's handlers call it (:func:`openai_router`)."""

    def __init__(self, engine: EngineClient, settings: ApiSettings, workers: PromptWorkers) -> None:
        self.engine, self.settings, self.workers = engine, settings, workers

    def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [_model_entry(m) for m in self.engine.models() if m.state == "Ready"]}

    def retrieve_model(self, model_id: str) -> dict[str, Any] | Response:
        for m in self.engine.models():
            if m.alias == model_id and m.state == "Ready":
                return _model_entry(m)
        return error_response(
            404,
            f"the model {model_id!r} does not exist or is not being served now",
            type_="invalid_request_error",
            param="model",
            code="model_not_found",
        )

    async def serve(
        self,
        request: Request,
        tenant: str,
        schema: type[T],
        prompt_of: Callable[[T, TextCodec], tuple[list[int], int]],
        *,
        chat: bool,
    ) -> Response:
        """Both endpoints: parse the body, find the model's codec, build the prompt and its ``max_tokens``
        (``prompt_of``; Refused is its 400), generate. Every answer carries the request's id, and every
        refusal of a served model its 001 §14 record.

        Parsing, validation, the chat template and tokenization take time in proportion to the body, so they
        run in worker threads, never on the event loop (001 §9.2: a megabyte prompt to A must not hold up B's
        tokens or ``/health/live``); the prompt in its model's own pool, so A's big prompts queue behind each
        other, not in front of B's. A body under ``workers.INLINE_BODY`` bytes is the exception: its bounded work
        costs the loop less than the hand-offs would cost its time to first token."""
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        # Already read, under the size limit, by the guard; taken out of the scope, which lives as long as a
        # stream does, so that a big prompt's bytes go once the prompt is built.
        raw = request.scope.pop(BODY_SCOPE_KEY, None)
        if not isinstance(raw, bytes):  # no guard in front (an embedding app), or no body
            raw = await request.body()
        named: list[str] = []  # the model the body names, once it parsed
        try:
            prepared = await self._prepare(raw, schema, prompt_of, named)
            return await self._generate(request, request_id, tenant, prepared, chat=chat)
        except Refused as refused:
            if refused.alias is not None:
                why = EngineRejection(RejectCode.INVALID, "refused by the HTTP layer")
                self.engine.refused(Refusal(request_id, refused.alias, tenant, refused.prompt_tokens, why))
            return _tagged(refused.response, request_id)
        except EngineRejection as exc:  # 404, or refused at admission: the same error the handler gives, tagged
            if exc.code is RejectCode.MODEL_NOT_FOUND and named:  # admission records its own
                self.engine.refused(Refusal(request_id, named[0], tenant, None, exc))
            return _tagged(rejection_response(exc, chat=chat), request_id)

    async def _prepare(
        self,
        raw: bytes,
        schema: type[T],
        prompt_of: Callable[[T, TextCodec], tuple[list[int], int]],
        named: list[str],
    ) -> _Prepared:
        """The body parsed and its prompt built, in worker threads; ``named`` gets the model it names."""
        loop = asyncio.get_running_loop()
        workers = self.workers
        if schema is CompletionRequest and len(raw) >= BIG_BODY:
            # A prompt of more token ids than the context is refused from its bytes, before any JSON parser
            # builds its ints while holding the interpreter lock the event loop needs.
            # Paced like the parse below: a client sending such bodies back to back gets half the thread.
            await loop.run_in_executor(workers.scan, paced, refuse_long_ids, raw, self.context_of)
        parse = functools.partial(parse_body, raw, schema, self.context_of)
        if len(raw) >= BIG_INPUT:
            parse = functools.partial(paced, parse)
        inline = len(raw) < INLINE_BODY  # bounded work, cheaper here than two hand-offs (workers.INLINE_BODY)
        body: Any = parse() if inline else await loop.run_in_executor(workers.parse(len(raw)), parse)
        named.append(body.model)
        codec = self.engine.codec(body.model)
        sampling = sampling_params(body, codec.vocab_size, body.model)
        if isinstance(sampling, Response):  # a parameter out of range: a 400 of the HTTP layer, recorded
            raise Refused(sampling, body.model)
        if inline:
            prompt_ids, max_tokens = _prompt_tuple(prompt_of, body, codec)
        else:
            pool = workers.for_model(body.model, big=len(raw) >= BIG_BODY)
            prompt_ids, max_tokens = await loop.run_in_executor(pool, _prompt_tuple, prompt_of, body, codec)
        return _Prepared(body, codec, prompt_ids, max_tokens, sampling)

    def completion_prompt(self, body: CompletionRequest, codec: TextCodec) -> tuple[list[int], int]:
        if isinstance(body.prompt, list) and body.prompt and not isinstance(body.prompt[0], str):
            prompt_ids = [int(t) for t in body.prompt]
            bad = next((t for t in prompt_ids if t >= codec.vocab_size), None)
            if bad is not None:
                message = f"token id {bad} is outside the vocabulary of {body.model!r} ({codec.vocab_size} entries)"
                raise Refused(invalid(message, param="prompt", code="invalid_prompt"), body.model, len(prompt_ids))
            return prompt_ids, body.max_tokens or 16
        text = body.prompt if isinstance(body.prompt, str) else str(body.prompt[0])
        limit = self.engine.context_limit(body.model)
        return encode_prompt(codec, text, limit, body.model, "prompt"), body.max_tokens or 16

    def chat_prompt(self, body: ChatCompletionRequest, codec: TextCodec) -> tuple[list[int], int]:
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            prompt = codec.render_chat(messages, add_generation_prompt=True)  # the model's own template
        except (ValueError, ChatTemplateError) as exc:
            raise Refused(invalid(str(exc), param="messages", code="invalid_messages"), body.model) from None
        limit = self.engine.context_limit(body.model)
        prompt_ids = encode_prompt(codec, prompt, limit, body.model, "messages")
        max_tokens = body.max_completion_tokens or body.max_tokens or self.settings.chat_default_max_tokens
        if max_tokens is None:
            max_tokens = max(1, limit - len(prompt_ids))
        return prompt_ids, max_tokens

    def context_of(self, alias: object) -> int | None:
        """The context limit of ``alias``: None when it is no string (its 400 comes from the schema),
        EngineRejection (404) when the engine does not serve it."""
        return self.engine.context_limit(alias) if isinstance(alias, str) else None

    async def _generate(self, request: Request, request_id: str, tenant: str, p: _Prepared, *, chat: bool) -> Response:
        body = p.body
        gen = GenerationRequest(
            request_id=request_id,
            alias=body.model,
            tenant=tenant,
            prompt_ids=p.prompt_ids,
            max_tokens=p.max_tokens,
            sampling=p.sampling,
            timeout_s=body.timeout,
            ignore_eos=body.ignore_eos,
            stop=tuple(body.stop_list()),
        )
        stream = self.engine.submit(gen)  # raises EngineRejection -> real HTTP status
        try:
            await _race_disconnect(request, stream.admitted())
        except asyncio.CancelledError:
            stream.cancel("client_disconnected")
            return Response(status_code=499, headers={"X-Request-Id": request_id})
        except EngineRejection:
            stream.cancel("rejected")
            raise
        answer = _Answer(request_id, body.model, int(time.time()), chat)
        deltas = text_deltas(stream, p.codec, body.stop_list(), prompt_ids=p.prompt_ids)
        shape = LogprobShape(chat, TokenNames(p.codec)) if p.sampling.logprobs is not None else None
        if body.stream:
            return _stream_response(answer, deltas, stream, body.stream_options, shape)
        return await _collected_response(request, answer, deltas, stream, shape)


@dataclass(frozen=True)
class _Answer:
    """What every response of one request carries."""

    request_id: str
    model: str
    created: int
    chat: bool


def _stream_response(
    answer: _Answer, deltas: AsyncIterator[Delta], stream: RequestStream, opts: Any, shape: LogprobShape | None
) -> Response:
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    outcome = _SseOutcome()
    a = answer
    return _SseResponse(
        _sse(deltas, stream, a.model, a.request_id, a.created, a.chat, include_usage, outcome, continuous, shape),
        engine_stream=stream,
        outcome=outcome,
        media_type="text/event-stream",
        headers={"X-Request-Id": a.request_id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _collected_response(
    request: Request, answer: _Answer, deltas: AsyncIterator[Delta], stream: RequestStream, shape: LogprobShape | None
) -> Response:
    request_id = answer.request_id
    headers = {"X-Request-Id": request_id}
    try:
        last = await _race_disconnect(request, _collect(deltas))
    except asyncio.CancelledError:
        stream.cancel("client_disconnected")
        return Response(status_code=499, headers=headers)
    except Exception:  # an engine bug: release the request, answer in OpenAI form, keep details in the log
        log.exception("request %s: the engine failed while generating", request_id)
        stream.cancel("engine_error")
        return _tagged(error_response(500, INTERNAL_ERROR[1], type_="server_error", code=INTERNAL_ERROR[0]), request_id)
    text, end, entries = last
    if end.error is not None:
        log.error("request %s: generation failed: %s", request_id, end.error)
        code, message = _public_error(end)
        return _tagged(
            error_response(503, message, type_="service_unavailable", code=code, retry_after_s=1), request_id
        )
    logprobs = None if shape is None else shape.of(entries)
    if answer.chat:
        message_ = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "message": message_, "logprobs": logprobs, "finish_reason": end.finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": end.finish}
    doc = {
        "id": request_id,
        "object": "chat.completion" if answer.chat else "text_completion",
        "created": answer.created,
        "model": answer.model,
        "choices": [choice],
        "usage": end.usage,
    }
    return JSONResponse(doc, headers=headers)


def _prompt_tuple(
    prompt_of: Callable[[T, TextCodec], tuple[list[int], int]], body: T, codec: TextCodec
) -> tuple[tuple[int, ...], int]:
    """``prompt_of`` with the ids as the tuple the engine takes, built here rather than on the event loop."""
    ids, max_tokens = prompt_of(body, codec)
    return tuple(ids), max_tokens


def _tagged(response: Response, request_id: str) -> Response:
    response.headers["X-Request-Id"] = request_id
    return response


def _sse_event(doc: dict[str, Any], event: str | None = None) -> bytes:
    """One SSE event carrying ``doc`` as compact JSON (UTF-8; orjson where it can encode it, else the standard
    library, whose output a client parses to the same document)."""
    head = b"data: " if event is None else b"event: " + event.encode() + b"\ndata: "
    if orjson is not None:
        try:
            return head + orjson.dumps(doc) + b"\n\n"
        except TypeError:  # orjson.JSONEncodeError: e.g. an integer beyond 64 bits
            pass
    return head + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def _collect(deltas: AsyncIterator[Delta]) -> tuple[str, Delta, list[TokenLogprob]]:
    parts: list[str] = []
    entries: list[TokenLogprob] = []
    last = Delta("", {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "length")
    async for d in deltas:
        parts.append(d.text)
        entries.extend(d.logprobs)
        last = d
    return "".join(parts), last, entries


async def _sse(
    deltas: AsyncIterator[Delta],
    stream: RequestStream,
    model: str,
    request_id: str,
    created: int,
    chat: bool,
    include_usage: bool,
    outcome: _SseOutcome,
    continuous_usage: bool = False,
    shape: LogprobShape | None = None,
) -> AsyncGenerator[bytes, None]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(
        text: str | None,
        finish: str | None,
        *,
        role: bool = False,
        usage: dict[str, int] | None = None,
        running: dict[str, int] | None = None,
        entries: Sequence[TokenLogprob] = (),
    ) -> bytes:
        # A chunk that covers tokens carries their logprobs; one that covers none (the role, the finish after
        # the last text) carries null, as OpenAI's do.
        logprobs = shape.of(entries) if shape is not None and entries else None
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choices = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]
        doc: dict[str, Any] = {"id": request_id, "object": obj, "created": created, "model": model, "choices": choices}
        if usage is not None:
            doc = {**doc, "choices": [], "usage": usage}
        elif running is not None:
            doc["usage"] = running
        return _sse_event(doc)

    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    try:
        if chat:
            yield chunk("", None, role=True)
        async for d in deltas:
            usage = d.usage
            running = usage if continuous_usage else None
            if d.finish is None:
                yield chunk(d.text, None, running=running, entries=d.logprobs)
                continue
            outcome.done = True
            if d.error is not None:
                log.error("request %s: generation failed: %s", request_id, d.error)
                code, message = _public_error(d)
                err = error_body(message, type_="service_unavailable", code=code)
                yield _sse_event(err, "error")
                return
            if d.text:
                yield chunk(d.text, None, running=running, entries=d.logprobs)
            elif d.logprobs:  # tokens that added no text (a held character the end flushed as nothing)
                yield chunk("", None, running=running, entries=d.logprobs)
            yield chunk(None if chat else "", d.finish, running=running)
        if include_usage:
            yield chunk(None, None, usage=usage)
        yield b"data: [DONE]\n\n"
    except Exception:
        # An engine bug after the headers went out: the status cannot change any more, so say so in the
        # stream (never a silent truncation, never [DONE]) and release the request once.
        log.exception("request %s: the engine failed while streaming", request_id)
        outcome.done = True
        stream.cancel("engine_error")
        err = error_body(INTERNAL_ERROR[1], type_="server_error", code=INTERNAL_ERROR[0])
        yield _sse_event(err, "error")
    # No ``finally: cancel`` here: _SseResponse releases the stream if this generator did not finish.


__all__ = ["OpenAIRoutes", "openai_router"]
