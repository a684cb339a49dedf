"""FastAPI application: OpenAI-compatible endpoints, health, metrics and admin.

Rules this layer enforces (001 §10.1, 000 §5.2, §16):

* validation and admission finish before the first SSE byte, so 400/404/429/503
  are real HTTP statuses with OpenAI-style error bodies; 429 and 503 carry
  ``Retry-After``;
* a client that disconnects, streaming or not, cancels its request;
* an error after streaming started is sent as an SSE ``error`` event and the
  stream is closed (never a silent truncation);
* public responses never carry chip ids, paths, addresses or reset controls;
* ``/health/live`` never touches the scheduler.

The engine does the work; this module only translates.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from calctl import __version__
from calctl.serving.api.schemas import ChatCompletionRequest, CompletionRequest
from calctl.serving.config import ExecutorMode
from calctl.serving.protocol import (
    Engine,
    EngineRejection,
    FinishReason,
    GenerationRequest,
    RejectCode,
    RequestStream,
    SamplingParams,
)
from calctl.serving.text import ChatTemplateError, IncrementalDetokenizer, StopMatcher

T = TypeVar("T")
DISCONNECT_POLL_S = 0.05
log = logging.getLogger(__name__)

# What a client sees when generation fails after admission. The engine's own text (``TokenEvent.error``,
# an exception) may name a chip, a core, an address or a file, which public responses never show
# (001 §10.1); it goes to the log with the request id instead.
DEVICE_ERROR_MESSAGE = "the model failed while generating this response; retry the request"
EXECUTOR_MODES = tuple(m.value for m in ExecutorMode)  # docs/executor.md
INTERNAL_ERROR_MESSAGE = "internal error while generating this response; retry the request"


@dataclass(frozen=True)
class ApiSettings:
    api_keys: dict[str, str] = field(default_factory=dict)  # key -> tenant
    admin_keys: frozenset[str] = frozenset()
    default_tenant: str = "default"
    chat_default_max_tokens: int | None = None  # None: up to the context limit


def error_body(
    status: int, message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    retry_after_s: float | None = None,
) -> JSONResponse:
    headers = {}
    if retry_after_s is not None or status in (429, 503):
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s or 1)))
    return JSONResponse(
        error_body(status, message, type_=type_, param=param, code=code), status_code=status, headers=headers
    )


def rejection_response(exc: EngineRejection) -> JSONResponse:
    status = exc.code.http_status
    param = exc.param
    if param is None and exc.code is RejectCode.MODEL_NOT_FOUND:
        param = "model"  # OpenAI names the parameter; the engine's rejection need not
    type_ = {
        400: "invalid_request_error",
        404: "invalid_request_error",
        429: "rate_limit_error",
        503: "service_unavailable",
    }[status]
    return error_response(
        status, exc.message, type_=type_, param=param, code=exc.code.value, retry_after_s=exc.retry_after_s
    )


class _Unauthorized(Exception):
    pass


class _AdminDisabled(Exception):
    pass


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _match_key(given: str | None, keys: dict[str, str] | frozenset[str]) -> str | None:
    if given is None:
        return None
    for k in keys:
        if hmac.compare_digest(given.encode(), k.encode()):
            return k
    return None


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


def create_app(engine: Engine, settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    app = FastAPI(title="calctl serve", version=__version__, docs_url=None, redoc_url=None)

    def tenant_of(request: Request) -> str:
        if not settings.api_keys:
            return settings.default_tenant
        key = _match_key(_bearer(request), settings.api_keys)
        if key is None:
            raise _Unauthorized()
        return settings.api_keys[key]

    def require_admin(request: Request) -> None:
        if settings.admin_keys:
            if _match_key(_bearer(request), settings.admin_keys) is None:
                raise _Unauthorized()
        elif settings.api_keys:
            # API keys but no admin key: the server may listen beyond loopback, so /internal (cancel anyone's
            # request, unload a model) stays closed rather than open to every client. With no keys at all
            # the server binds to loopback only (001 §10.1) and /internal is open to local callers.
            raise _AdminDisabled()

    @app.exception_handler(_Unauthorized)
    async def _unauth(_: Request, __: _Unauthorized) -> JSONResponse:
        return JSONResponse(
            error_body(401, "missing or invalid API key", type_="invalid_request_error", code="invalid_api_key"),
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(_AdminDisabled)
    async def _admin_disabled(_: Request, __: _AdminDisabled) -> JSONResponse:
        return JSONResponse(
            error_body(
                403,
                "the admin API is disabled: no admin key is configured",
                type_="permission_error",
                code="admin_disabled",
            ),
            status_code=403,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        return error_response(
            400,
            f"{'.'.join(loc) or 'body'}: {first.get('msg')}",
            type_="invalid_request_error",
            param=".".join(loc) or None,
            code="invalid_request",
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and methods: the same OpenAI error body as every other error, not {"detail": ...}.
        return JSONResponse(
            error_body(
                exc.status_code,
                str(exc.detail),
                type_="invalid_request_error",
                code="not_found" if exc.status_code == 404 else None,
            ),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(EngineRejection)
    async def _rejected(_: Request, exc: EngineRejection) -> JSONResponse:
        return rejection_response(exc)

    # -- health and metrics -----------------------------------------------------------

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        if engine.is_draining():
            return JSONResponse({"status": "draining"}, status_code=503)
        ok = engine.is_ready(None)
        models = {m.alias: m.state for m in engine.models()}
        return JSONResponse(
            {"status": "ready" if ok else "not_ready", "models": models}, status_code=200 if ok else 503
        )

    @app.get("/health/ready/{alias}")
    async def ready_model(alias: str) -> JSONResponse:
        states = {m.alias: m.state for m in engine.models()}
        if alias not in states:
            return error_response(
                404,
                f"model {alias!r} does not exist",
                type_="invalid_request_error",
                param="model",
                code="model_not_found",
            )
        ok = engine.is_ready(alias) and not engine.is_draining()
        return JSONResponse({"model": alias, "state": states[alias]}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- OpenAI endpoints -------------------------------------------------------------

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        tenant_of(request)
        data = [
            {"id": m.alias, "object": "model", "created": m.created, "owned_by": "calctl"}
            for m in engine.models()
            if m.state == "Ready"
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        tenant = tenant_of(request)
        body = await _parse(request, CompletionRequest)
        if isinstance(body, Response):
            return body
        codec = engine.codec(body.model)
        if isinstance(body.prompt, str):
            prompt_ids = codec.encode(body.prompt)
        elif body.prompt and isinstance(body.prompt[0], str):
            prompt_ids = codec.encode(body.prompt[0])
        else:
            prompt_ids = list(body.prompt)  # type: ignore[arg-type]
            bad = [t for t in prompt_ids if t >= codec.vocab_size]
            if bad:
                return error_response(
                    400,
                    f"token id {bad[0]} is outside the vocabulary of {body.model!r} ({codec.vocab_size} entries)",
                    type_="invalid_request_error",
                    param="prompt",
                    code="invalid_prompt",
                )
        max_tokens = body.max_tokens or 16
        return await _generate(request, tenant, body, prompt_ids, max_tokens, chat=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        tenant = tenant_of(request)
        body = await _parse(request, ChatCompletionRequest)
        if isinstance(body, Response):
            return body
        codec = engine.codec(body.model)
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            prompt = codec.render_chat(messages, add_generation_prompt=True)
        except (ValueError, ChatTemplateError) as exc:
            return error_response(
                400, str(exc), type_="invalid_request_error", param="messages", code="invalid_messages"
            )
        prompt_ids = codec.encode(prompt)
        limit = engine.context_limit(body.model)
        max_tokens = body.max_completion_tokens or body.max_tokens or settings.chat_default_max_tokens
        if max_tokens is None:
            max_tokens = max(1, limit - len(prompt_ids))
        return await _generate(request, tenant, body, prompt_ids, max_tokens, chat=True)

    async def _parse(request: Request, model: type[T]) -> T | Response:
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(
                400, "request body is not valid JSON", type_="invalid_request_error", code="invalid_json"
            )
        if not isinstance(raw, dict):
            return error_response(
                400, "request body must be a JSON object", type_="invalid_request_error", code="invalid_json"
            )
        try:
            body = model.model_validate(raw)  # type: ignore[attr-defined]
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            return error_response(
                400,
                f"{loc or 'body'}: {first.get('msg')}",
                type_="invalid_request_error",
                param=loc or None,
                code="invalid_request",
            )
        unsupported = body.unsupported()
        if unsupported:
            return error_response(
                400, unsupported[1], type_="invalid_request_error", param=unsupported[0], code="unsupported_parameter"
            )
        return body

    async def _generate(
        request: Request, tenant: str, body: Any, prompt_ids: list[int], max_tokens: int, *, chat: bool
    ) -> Response:
        prefix = "chatcmpl" if chat else "cmpl"
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        gen = GenerationRequest(
            request_id=request_id,
            alias=body.model,
            tenant=tenant,
            prompt_ids=tuple(prompt_ids),
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature=body.temperature, top_p=body.top_p, seed=body.seed),
            timeout_s=body.timeout,
        )
        stream = engine.submit(gen)  # raises EngineRejection -> real HTTP status
        try:
            await _race_disconnect(request, stream.admitted())
        except asyncio.CancelledError:
            stream.cancel("client_disconnected")
            return Response(status_code=499)
        except EngineRejection:
            stream.cancel("rejected")
            raise
        created = int(time.time())
        codec = engine.codec(body.model)
        headers = {"X-Request-Id": request_id}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            outcome = _SseOutcome()
            return _SseResponse(
                _sse(stream, codec, body, request_id, created, chat, include_usage, outcome),
                engine_stream=stream,
                outcome=outcome,
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            text, finish, usage, error = await _race_disconnect(request, _collect(stream, codec, body.stop_list()))
        except asyncio.CancelledError:
            stream.cancel("client_disconnected")
            return Response(status_code=499)
        except Exception:  # an engine bug: release the request, answer in OpenAI form, keep details in the log
            log.exception("request %s: the engine failed while generating", request_id)
            stream.cancel("engine_error")
            return error_response(500, INTERNAL_ERROR_MESSAGE, type_="server_error", code="internal_error")
        if error is not None:
            log.error("request %s: generation failed: %s", request_id, error)
            return error_response(
                503, DEVICE_ERROR_MESSAGE, type_="service_unavailable", code="device_error", retry_after_s=1
            )
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return JSONResponse(
            {
                "id": request_id,
                "object": obj,
                "created": created,
                "model": body.model,
                "choices": [choice],
                "usage": usage,
            },
            headers=headers,
        )

    async def _collect(
        stream: RequestStream, codec: Any, stops: list[str]
    ) -> tuple[str, str, dict[str, int], str | None]:
        detok = IncrementalDetokenizer(codec)
        matcher = StopMatcher(stops)
        parts: list[str] = []
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        finish = "length"
        async for ev in stream:
            usage = _usage(ev)
            if ev.token_id is not None and not (ev.finish is FinishReason.STOP and ev.token_id == codec.eos_token_id):
                safe, stopped = matcher.feed(detok.push(ev.token_id))
                parts.append(safe)
                if stopped:
                    # Stop reading here, as _sse does: after finish() the engine may still deliver a token
                    # already in flight, or nothing at all, so waiting for more would crash or hang.
                    stream.finish(FinishReason.STOP)
                    finish = "stop"
                    break
            if ev.finish is not None:
                if ev.finish is FinishReason.ERROR:
                    return "", "error", usage, ev.error or "device error"
                safe, stopped = matcher.feed(detok.flush())
                parts.append(safe)
                parts.append(matcher.flush() if not stopped else "")
                finish = "stop" if stopped else _finish_name(ev.finish)
                break
        return "".join(parts), finish, usage, None

    async def _sse(
        stream: RequestStream,
        codec: Any,
        body: Any,
        request_id: str,
        created: int,
        chat: bool,
        include_usage: bool,
        outcome: _SseOutcome,
    ) -> AsyncGenerator[bytes, None]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(
            delta_text: str | None, finish: str | None, *, role: bool = False, usage: dict[str, int] | None = None
        ) -> bytes:
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            else:
                choices = [{"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}]
            doc: dict[str, Any] = {
                "id": request_id,
                "object": obj,
                "created": created,
                "model": body.model,
                "choices": choices,
            }
            if usage is not None:
                doc = {**doc, "choices": [], "usage": usage}
            return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n".encode()

        detok = IncrementalDetokenizer(codec)
        matcher = StopMatcher(body.stop_list())
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        try:
            if chat:
                yield chunk("", None, role=True)
            async for ev in stream:
                usage = _usage(ev)
                if ev.token_id is not None and not (
                    ev.finish is FinishReason.STOP and ev.token_id == codec.eos_token_id
                ):
                    safe, stopped = matcher.feed(detok.push(ev.token_id))
                    if safe:
                        yield chunk(safe, None)
                    if stopped:
                        stream.finish(FinishReason.STOP)
                        outcome.done = True
                        yield chunk(None if chat else "", "stop")
                        break
                if ev.finish is not None:
                    if ev.finish is FinishReason.ERROR:
                        outcome.done = True
                        log.error("request %s: generation failed: %s", request_id, ev.error or "device error")
                        err = error_body(503, DEVICE_ERROR_MESSAGE, type_="service_unavailable", code="device_error")
                        yield f"event: error\ndata: {json.dumps(err)}\n\n".encode()
                        return
                    outcome.done = True
                    safe, stopped = matcher.feed(detok.flush())
                    tail = safe + ("" if stopped else matcher.flush())
                    if tail:
                        yield chunk(tail, None)
                    yield chunk(None if chat else "", "stop" if stopped else _finish_name(ev.finish))
                    break
            if include_usage:
                yield chunk(None, None, usage=usage)
            yield b"data: [DONE]\n\n"
        except Exception:
            # An engine bug after the headers went out: the status cannot change any more, so say so in the
            # stream (never a silent truncation, never [DONE]) and release the request once.
            log.exception("request %s: the engine failed while streaming", request_id)
            outcome.done = True
            stream.cancel("engine_error")
            err = error_body(500, INTERNAL_ERROR_MESSAGE, type_="server_error", code="internal_error")
            yield f"event: error\ndata: {json.dumps(err)}\n\n".encode()
        # No ``finally: cancel`` here: _SseResponse releases the stream if this generator did not finish.

    # -- internal endpoints --------------------------------------------------------------

    @app.delete("/internal/requests/{request_id}")
    async def cancel_request(request_id: str, request: Request) -> JSONResponse:
        require_admin(request)
        found = engine.cancel(request_id)
        if not found:
            return error_response(
                404, f"no live request {request_id!r}", type_="invalid_request_error", code="request_not_found"
            )
        return JSONResponse({"id": request_id, "cancelled": True})

    # Declared before the generic /{action} route, which would otherwise match "executor".
    @app.get("/internal/models/{alias}/executor")
    async def executor_status(alias: str, request: Request) -> JSONResponse:
        require_admin(request)
        engine.codec(alias)  # 404 for unknown aliases
        return JSONResponse(dict(await engine.executor(alias)))

    @app.post("/internal/models/{alias}/executor")
    async def set_executor_mode(alias: str, request: Request) -> JSONResponse:
        """Operator action (000 §14): the executor mode for new jobs; the only way back to ping/pong."""
        require_admin(request)
        engine.codec(alias)
        try:
            body = await request.json()
        except ValueError:
            body = None
        mode = body.get("mode") if isinstance(body, dict) else None
        if mode not in EXECUTOR_MODES:
            return error_response(
                400,
                f'body must be {{"mode": one of {", ".join(EXECUTOR_MODES)}}}',
                type_="invalid_request_error",
                param="mode",
                code="invalid_request",
            )
        outcome = await engine.executor(alias, mode)
        return JSONResponse(dict(outcome), status_code=200 if outcome.get("ok") else 409)

    @app.post("/internal/models/{alias}/{action}")
    async def admin_model(alias: str, action: str, request: Request) -> JSONResponse:
        require_admin(request)
        if action not in ("load", "unload", "reload"):
            return error_response(
                404, f"unknown action {action!r}; expected load, unload or reload", type_="invalid_request_error"
            )
        engine.codec(alias)  # 404 for unknown aliases
        outcome = await engine.admin(alias, action)
        status = 200 if outcome.get("ok") else 409
        return JSONResponse(dict(outcome), status_code=status)

    return app


def _usage(ev: Any) -> dict[str, int]:
    return {
        "prompt_tokens": ev.prompt_tokens,
        "completion_tokens": ev.completion_tokens,
        "total_tokens": ev.prompt_tokens + ev.completion_tokens,
    }


def _finish_name(reason: FinishReason) -> str:
    return {
        FinishReason.STOP: "stop",
        FinishReason.LENGTH: "length",
        FinishReason.CANCELLED: "cancelled",
        FinishReason.ERROR: "error",
    }[reason]
