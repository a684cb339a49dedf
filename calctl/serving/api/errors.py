"""OpenAI-style error bodies and the exception handlers of the app (001 §10.1, 000 §5.2).

Every error the API answers has the OpenAI shape ``{"error": {"message", "type",
"param", "code"}}``; 429 and 503 carry ``Retry-After``. The status, type and code
of an engine rejection come from the one outcome table
(:mod:`calctl.serving.outcomes`), never from a table here. Request validation
errors use the OpenAI spelling ``invalid_request_error`` for both type and code.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from calctl.serving import outcomes
from calctl.serving.protocol import EngineRejection, RejectCode

INVALID = "invalid_request_error"  # OpenAI's type and code for a malformed request
log = logging.getLogger("calctl.serving.api")


class Unauthorized(Exception):
    """No API key, or not one of the configured ones: 401."""


class AdminDisabled(Exception):
    """The admin API is closed (API keys but no admin key): 403."""


def error_body(message: str, *, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
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
    return JSONResponse(error_body(message, type_=type_, param=param, code=code), status_code=status, headers=headers)


def invalid(message: str, *, param: str | None = None, code: str = INVALID) -> JSONResponse:
    """A 400 for a request the API itself refuses (bad JSON, a bad field, an unsupported parameter)."""
    return error_response(400, message, type_=INVALID, param=param, code=code)


def rejection_response(exc: EngineRejection, *, chat: bool = False) -> JSONResponse:
    r = outcomes.rejection(exc.code)  # the one table: status, OpenAI type and code
    param = exc.param
    if param is None and exc.code is RejectCode.MODEL_NOT_FOUND:
        param = "model"  # OpenAI names the parameter; the engine's rejection need not
    if param == "prompt" and chat:
        param = "messages"  # the chat endpoint's prompt is its messages
    return error_response(
        r.http_status,
        exc.message,
        type_=r.error_type,
        param=param,
        code=exc.code.value,
        retry_after_s=exc.retry_after_s,
    )


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(Unauthorized)
    async def _unauth(_: Request, __: Unauthorized) -> JSONResponse:
        return JSONResponse(
            error_body("missing or invalid API key", type_=INVALID, code="invalid_api_key"),
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(AdminDisabled)
    async def _admin_disabled(_: Request, __: AdminDisabled) -> JSONResponse:
        return JSONResponse(
            error_body(
                "the admin API is disabled: no admin key is configured", type_="permission_error", code="admin_disabled"
            ),
            status_code=403,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        return invalid(f"{'.'.join(loc) or 'body'}: {first.get('msg')}", param=".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and methods: the same OpenAI error body as every other error, not {"detail": ...}.
        return JSONResponse(
            error_body(str(exc.detail), type_=INVALID, code="not_found" if exc.status_code == 404 else None),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: Request, _: ClientDisconnect) -> Response:
        # The guard reads bodies before routes do, so this is a safety net: one line in the log, never the
        # 70-line traceback an aborted upload used to leave (any client could fill the log with them).
        log.info("%s %s: the client closed the connection while sending its body", request.method, request.url.path)
        return Response(status_code=499)

    @app.exception_handler(EngineRejection)
    async def _rejected(request: Request, exc: EngineRejection) -> JSONResponse:
        return rejection_response(exc, chat=request.url.path.endswith("/chat/completions"))


__all__ = [
    "INVALID",
    "AdminDisabled",
    "Unauthorized",
    "error_body",
    "error_response",
    "install_handlers",
    "invalid",
    "rejection_response",
]
