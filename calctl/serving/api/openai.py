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
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from calctl.serving import outcomes
from calctl.serving.api.auth import ApiSettings, Auth
from calctl.serving.api.deltas import Delta, text_deltas
from calctl.serving.api.errors import error_body, error_response, invalid, rejection_response
from calctl.serving.api.logprobs import LogprobShape, TokenNames
from calctl.serving.api.sampling import sampling_params
from calctl.serving.api.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from calctl.serving.api.workers import PromptWorkers
from calctl.serving.protocol import (
    EngineClient,
    EngineRejection,
    GenerationRequest,
    ModelInfo,
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
    router = APIRouter()

    def model_entry(m: ModelInfo) -> dict[str, Any]:
        # max_model_len: vLLM's name for the context length a request may use (prompt + output), which
        # clients and harnesses already read; here it is what admission enforces (001 §10.4).
        return {
            "id": m.alias,
            "object": "model",
            "created": m.created,
            "owned_by": "calctl",
            "max_model_len": m.context_limit,
        }

    @router.get("/v1/models")
    async def list_models(_: str = Depends(auth.tenant)) -> dict[str, Any]:
        return {"object": "list", "data": [model_entry(m) for m in engine.models() if m.state == "Ready"]}

    @router.get("/v1/models/{model_id:path}", response_model=None)
    async def retrieve_model(model_id: str, _: str = Depends(auth.tenant)) -> dict[str, Any] | Response:
        """The OpenAI ``models.retrieve``: a model ``/v1/models`` lists, else a 404 in OpenAI's error shape."""
        for m in engine.models():
            if m.alias == model_id and m.state == "Ready":
                return model_entry(m)
        return error_response(
            404,
            f"the model {model_id!r} does not exist or is not being served now",
            type_="invalid_request_error",
            param="model",
            code="model_not_found",
        )

    @router.post("/v1/completions", response_model=None)
    async def completions(request: Request, tenant: str = Depends(auth.tenant)) -> Response:
        return await _serve(request, tenant, CompletionRequest, _completion_prompt, chat=False)

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request, tenant: str = Depends(auth.tenant)) -> Response:
        return await _serve(request, tenant, ChatCompletionRequest, _chat_prompt, chat=True)

    async def _serve(
        request: Request,
        tenant: str,
        schema: type[T],
        prompt_of: Callable[[T, TextCodec], tuple[list[int], int] | Response],
        *,
        chat: bool,
    ) -> Response:
        """Both endpoints: parse the body, find the model's codec, build the prompt and its ``max_tokens``
        (``prompt_of``; a Response is its 400), generate. Every answer carries the request's id.

        Parsing, validation, the chat template and tokenization take time in proportion to the body, so they
        run in worker threads, never on the event loop (001 §9.2: a megabyte prompt to A must not hold up B's
        tokens or ``/health/live``); the prompt in its model's own pool, so A's big prompts queue behind each
        other, not in front of B's."""
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        loop = asyncio.get_running_loop()
        raw = await request.body()  # already read, under the size limit, by the guard
        try:
            body = await loop.run_in_executor(workers.parse, _parse, raw, schema, _context_of)
            if isinstance(body, Response):
                return _tagged(body, request_id)
            codec = engine.codec(body.model)  # type: ignore[attr-defined]
            sampling = sampling_params(body, codec.vocab_size, body.model)  # type: ignore[arg-type, attr-defined]
            if isinstance(sampling, Response):
                return _tagged(sampling, request_id)
            pool = workers.for_model(body.model)  # type: ignore[attr-defined]
            prompt = await loop.run_in_executor(pool, _prompt_tuple, prompt_of, body, codec)
            if isinstance(prompt, Response):
                return _tagged(prompt, request_id)
            prompt_ids, max_tokens = prompt
            return await _generate(
                request, request_id, tenant, body, codec, prompt_ids, max_tokens, sampling, chat=chat
            )
        except EngineRejection as exc:  # 404, or refused at admission: the same error the handler gives, tagged
            return _tagged(rejection_response(exc, chat=chat), request_id)

    def _completion_prompt(body: CompletionRequest, codec: TextCodec) -> tuple[list[int], int] | Response:
        if isinstance(body.prompt, list) and body.prompt and not isinstance(body.prompt[0], str):
            prompt_ids = [int(t) for t in body.prompt]
            bad = next((t for t in prompt_ids if t >= codec.vocab_size), None)
            if bad is not None:
                return invalid(
                    f"token id {bad} is outside the vocabulary of {body.model!r} ({codec.vocab_size} entries)",
                    param="prompt",
                    code="invalid_prompt",
                )
            return prompt_ids, body.max_tokens or 16
        text = body.prompt if isinstance(body.prompt, str) else str(body.prompt[0])
        ids = _encode(codec, text, engine.context_limit(body.model), body.model, "prompt")
        return ids if isinstance(ids, Response) else (ids, body.max_tokens or 16)

    def _chat_prompt(body: ChatCompletionRequest, codec: TextCodec) -> tuple[list[int], int] | Response:
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            prompt = codec.render_chat(messages, add_generation_prompt=True)  # the model's own template
        except (ValueError, ChatTemplateError) as exc:
            return invalid(str(exc), param="messages", code="invalid_messages")
        limit = engine.context_limit(body.model)
        prompt_ids = _encode(codec, prompt, limit, body.model, "messages")
        if isinstance(prompt_ids, Response):
            return prompt_ids
        max_tokens = body.max_completion_tokens or body.max_tokens or settings.chat_default_max_tokens
        if max_tokens is None:
            max_tokens = max(1, limit - len(prompt_ids))
        return prompt_ids, max_tokens

    def _context_of(alias: object) -> int | None:
        """The context limit of ``alias``: None when it is no string (its 400 comes from the schema),
        EngineRejection (404) when the engine does not serve it."""
        return engine.context_limit(alias) if isinstance(alias, str) else None

    async def _generate(
        request: Request,
        request_id: str,
        tenant: str,
        body: Any,
        codec: TextCodec,
        prompt_ids: tuple[int, ...],
        max_tokens: int,
        sampling: SamplingParams,
        *,
        chat: bool,
    ) -> Response:
        gen = GenerationRequest(
            request_id=request_id,
            alias=body.model,
            tenant=tenant,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            sampling=sampling,
            timeout_s=body.timeout,
            ignore_eos=body.ignore_eos,
            stop=tuple(body.stop_list()),
        )
        stream = engine.submit(gen)  # raises EngineRejection -> real HTTP status
        try:
            await _race_disconnect(request, stream.admitted())
        except asyncio.CancelledError:
            stream.cancel("client_disconnected")
            return Response(status_code=499, headers={"X-Request-Id": request_id})
        except EngineRejection:
            stream.cancel("rejected")
            raise
        created = int(time.time())
        headers = {"X-Request-Id": request_id}
        deltas = text_deltas(stream, codec, body.stop_list(), prompt_ids=prompt_ids)
        shape = LogprobShape(chat, TokenNames(codec)) if sampling.logprobs is not None else None
        if body.stream:
            opts = body.stream_options
            include_usage = bool(opts and opts.include_usage)
            continuous = bool(opts and opts.continuous_usage_stats)
            outcome = _SseOutcome()
            return _SseResponse(
                _sse(deltas, stream, body.model, request_id, created, chat, include_usage, outcome, continuous, shape),
                engine_stream=stream,
                outcome=outcome,
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            last = await _race_disconnect(request, _collect(deltas))
        except asyncio.CancelledError:
            stream.cancel("client_disconnected")
            return Response(status_code=499, headers=headers)
        except Exception:  # an engine bug: release the request, answer in OpenAI form, keep details in the log
            log.exception("request %s: the engine failed while generating", request_id)
            stream.cancel("engine_error")
            return _tagged(
                error_response(500, INTERNAL_ERROR[1], type_="server_error", code=INTERNAL_ERROR[0]), request_id
            )
        text, end, entries = last
        if end.error is not None:
            log.error("request %s: generation failed: %s", request_id, end.error)
            code, message = _public_error(end)
            return _tagged(
                error_response(503, message, type_="service_unavailable", code=code, retry_after_s=1), request_id
            )
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None if shape is None else shape.of(entries),
                "finish_reason": end.finish,
            }
            obj = "chat.completion"
        else:
            logprobs = None if shape is None else shape.of(entries)
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": end.finish}
            obj = "text_completion"
        return JSONResponse(
            {
                "id": request_id,
                "object": obj,
                "created": created,
                "model": body.model,
                "choices": [choice],
                "usage": end.usage,
            },
            headers=headers,
        )

    return router


def _parse(raw: bytes, model: type[T], context_of: Callable[[object], int | None]) -> T | Response:
    """The body as ``model``, or its 400 (worker thread: time in proportion to the body)."""
    doc = _json(raw)
    if doc is _NOT_JSON:
        return invalid("request body is not valid JSON", code="invalid_json")
    if not isinstance(doc, dict):
        return invalid("request body must be a JSON object", code="invalid_json")
    too_many = _too_many(doc, context_of)
    if too_many is not None:
        return too_many
    try:
        if isinstance(doc.get("messages"), list):
            doc = {**doc, "messages": _messages(doc["messages"])}
        body = model.model_validate(doc)  # type: ignore[attr-defined]
    except ValidationError as exc:
        return _invalid_field(exc)
    except _BadMessage as bad:
        return _invalid_field(bad.error, ("messages", bad.index))
    unsupported = body.unsupported()
    if unsupported:
        return invalid(unsupported[1], param=unsupported[0], code="unsupported_parameter")
    return body


_NOT_JSON = object()


#: A prompt of this many token ids or messages for a model the server does not have is its 404 before the schema.
HEAVY_ENTRIES = 1024


def _too_many(doc: dict[str, Any], context_of: Callable[[object], int | None]) -> Response | None:
    """The 400 of a prompt of token ids or a chat with more entries than the model's context has tokens, said
    before the schema runs: validating a million ids or a hundred thousand messages holds the interpreter lock
    (and stalls the event loop) for seconds, only to refuse them. Every message of a chat takes at least one
    token of the template's; an alias the engine does not serve has no limit here (its 404 comes later)."""
    ids, messages = doc.get("prompt"), doc.get("messages")
    many = isinstance(ids, list) and bool(ids) and type(ids[0]) is int
    if not (many or isinstance(messages, list)):
        return None
    entries = max(len(ids) if many else 0, len(messages) if isinstance(messages, list) else 0)  # type: ignore[arg-type]
    try:
        limit = context_of(doc.get("model"))
    except EngineRejection:
        if entries >= HEAVY_ENTRIES:
            raise  # the 404 now, not after seconds of validating entries that no model will read
        return None  # a small body: its field errors come first, as before
    if limit is None:
        return None
    alias = str(doc["model"])
    if many and len(ids) >= limit:  # type: ignore[arg-type]
        return _too_long(len(ids), limit, alias, "prompt")  # type: ignore[arg-type]
    if isinstance(messages, list) and len(messages) >= limit:
        return invalid(
            f"{alias}: {len(messages)} messages cannot fit context limit {limit} (each takes at least one token)",
            param="messages",
        )
    return None


class _BadMessage(Exception):
    def __init__(self, index: int, error: ValidationError) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


def _messages(items: list[Any]) -> list[Any]:
    """Each chat message validated on its own: between two the interpreter lock can go to the event loop,
    where one call over thousands of them holds it throughout. Raises _BadMessage for the first bad one."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(ChatMessage.model_validate(item))
        except ValidationError as exc:
            raise _BadMessage(i, exc) from None
    return out


def _invalid_field(exc: ValidationError, at: tuple[str | int, ...] = ()) -> Response:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in (*at, *first.get("loc", ())))
    return invalid(f"{loc or 'body'}: {first.get('msg')}", param=loc or None)


def _json(raw: bytes) -> Any:
    """The body's JSON document, or :data:`_NOT_JSON` when it is not JSON that can be text.

    orjson first (a quarter of the standard library's time, and it refuses a lone UTF-16 surrogate itself);
    what it refuses goes to the standard library, which also reads a UTF-16 or BOM-prefixed body."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    try:
        doc = json.loads(raw)
        # A lone UTF-16 surrogate ("\ud800") parses into a str that is no text: UTF-8 and the tokenizer
        # refuse it, so the whole body is. Python's json also fails with ValueError (an integer past its
        # digit limit) or RecursionError (deep nesting), not only JSONDecodeError; all are a 400, not a 500.
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError and UnicodeEncodeError too
        return _NOT_JSON
    return doc


def _encode(codec: TextCodec, text: str, limit: int, alias: str, param: str) -> list[int] | Response:
    """The prompt's ids, or the 400 of a prompt that leaves no room in the context for one output token."""
    ids, count = codec.encode_within(text, limit - 1)
    return _too_long(count, limit, alias, param) if ids is None else ids


def _too_long(count: int, limit: int, alias: str, param: str) -> Response:
    """The scheduler's own words for the prompt that fills the context (core admission decides every other
    case); said here so that the ids of a prompt that can never be served are not built, copied or checked."""
    return invalid(
        f"{alias}: prompt has {count} tokens; with at least 1 output token it exceeds context limit {limit}",
        param=param,
    )


def _prompt_tuple(
    prompt_of: Callable[[T, TextCodec], tuple[list[int], int] | Response], body: T, codec: TextCodec
) -> tuple[tuple[int, ...], int] | Response:
    """``prompt_of`` with the ids as the tuple the engine takes, built here rather than on the event loop."""
    prompt = prompt_of(body, codec)
    if isinstance(prompt, Response):
        return prompt
    return tuple(prompt[0]), prompt[1]


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


__all__ = ["openai_router"]
