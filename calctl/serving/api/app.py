"""The FastAPI application of ``calctl serve``: health, metrics, the OpenAI endpoints and the admin API.

Where things are:

* error bodies and exception handlers: :mod:`calctl.serving.api.errors`
  (statuses and codes from the one table, :mod:`calctl.serving.outcomes`);
* API keys, tenants and the admin check: :mod:`calctl.serving.api.auth`;
* ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``:
  :mod:`calctl.serving.api.openai`, over the one text-delta generator
  (:mod:`calctl.serving.api.deltas`);
* ``/health/live``, the body-size limit and ``X-Request-Id``: :mod:`calctl.serving.api.guard`, in front
  of every route;
* here: ``/health/ready*``, ``/metrics`` and ``/internal/*``.

Public responses never carry chip ids, paths, addresses or reset controls
(001 §10.1); ``/health/live`` never touches the scheduler (the guard answers it).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response

from calctl import __version__
from calctl.serving.api.auth import ApiSettings, Auth
from calctl.serving.api.errors import error_response, install_handlers, invalid
from calctl.serving.api.guard import RequestGuard
from calctl.serving.api.openai import openai_router
from calctl.serving.api.workers import PromptWorkers
from calctl.serving.config import ExecutorMode
from calctl.serving.protocol import EngineClient

EXECUTOR_MODES = tuple(m.value for m in ExecutorMode)  # docs/executor.md


def create_app(engine: EngineClient, settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    auth = Auth(settings)
    workers = PromptWorkers()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        workers.shutdown()  # a tokenization still running finishes in its thread; nobody waits for it

    app = FastAPI(title="calctl serve", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan)
    install_handlers(app)
    app.include_router(openai_router(engine, settings, auth, workers))
    # Outermost of the app's own layers: /health/live, the body-size limit and X-Request-Id come before routing.
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes)
    app.include_router(_health_router(engine))
    # Internal by default (docs/serve.md "Metrics access"): the admin key when the server has one, closed
    # when it has API keys but no admin key, open only to a keyless server, which binds to loopback.
    metrics_guard = [] if settings.metrics_public else [Depends(auth.admin)]
    app.include_router(_metrics_router(engine), dependencies=metrics_guard)
    app.include_router(_internal_router(engine), dependencies=[Depends(auth.admin)])
    return app


def _health_router(engine: EngineClient) -> APIRouter:
    router = APIRouter()

    @router.get("/health/live")
    async def live() -> dict[str, str]:
        # Reached only from an ASGI stack without the guard (it answers GET and HEAD before routing); the
        # route keeps the path's 405 for other methods.
        return {"status": "live"}

    @router.get("/health/ready")
    async def ready() -> JSONResponse:
        if engine.is_draining():
            return JSONResponse({"status": "draining"}, status_code=503)
        ok = engine.is_ready(None)
        models = {m.alias: m.state for m in engine.models()}
        body: dict[str, object] = {"status": "ready" if ok else "not_ready", "models": models}
        failed = engine.failures()
        if failed:
            body["failed"] = failed  # alias -> why it is Failed (001 §11.3: never stuck in Recovering)
        return JSONResponse(body, status_code=200 if ok else 503)

    @router.get("/health/ready/{alias}")
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
        one: dict[str, object] = {"model": alias, "state": states[alias]}
        if alias in engine.failures():
            one["failed"] = engine.failures()[alias]
        return JSONResponse(one, status_code=200 if ok else 503)

    return router


def _metrics_router(engine: EngineClient) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return router


def _internal_router(engine: EngineClient) -> APIRouter:
    """The internal endpoints (the admin key: the caller adds the dependency)."""
    router = APIRouter()

    @router.delete("/internal/requests/{request_id}")
    async def cancel_request(request_id: str) -> JSONResponse:
        if not engine.cancel(request_id):
            return error_response(
                404, f"no live request {request_id!r}", type_="invalid_request_error", code="request_not_found"
            )
        return JSONResponse({"id": request_id, "cancelled": True})

    @router.get("/internal/status")
    async def internal_status() -> JSONResponse:
        """Model states and generations, failures, the recoveries and their evidence files (docs/serve.md)."""
        return JSONResponse(jsonable_encoder(engine.status()))

    @router.get("/internal/trace")
    async def device_trace(since_ns: int = 0) -> JSONResponse:
        """The device's own job intervals per chip (``benchmarks/bench_serve.py`` reads them)."""
        return JSONResponse(dict(engine.trace(since_ns)))

    # Declared before the generic /{action} route, which would otherwise match "executor".
    @router.get("/internal/models/{alias}/executor")
    async def executor_status(alias: str) -> JSONResponse:
        engine.codec(alias)  # 404 for unknown aliases
        return JSONResponse(dict(await engine.executor(alias)))

    @router.post("/internal/models/{alias}/executor")
    async def set_executor_mode(alias: str, request: Request) -> JSONResponse:
        """Operator action (000 §14): the executor mode for new jobs; the only way back to ping/pong."""
        engine.codec(alias)
        try:
            body: Any = await request.json()
        except ValueError:
            body = None
        mode = body.get("mode") if isinstance(body, dict) else None
        if mode not in EXECUTOR_MODES:
            return invalid(f'body must be {{"mode": one of {", ".join(EXECUTOR_MODES)}}}', param="mode")
        outcome = await engine.executor(alias, mode)
        return JSONResponse(dict(outcome), status_code=200 if outcome.get("ok") else 409)

    @router.post("/internal/models/{alias}/{action}")
    async def admin_model(alias: str, action: str, request: Request) -> JSONResponse:
        if action not in ("load", "unload", "reload", "rollback"):
            return error_response(
                404,
                f"unknown action {action!r}; expected load, unload, reload or rollback",
                type_="invalid_request_error",
            )
        engine.codec(alias)  # 404 for unknown aliases
        package = _admin_package(await request.body())
        if isinstance(package, JSONResponse):
            return package
        outcome = await engine.admin(alias, action, package)
        return JSONResponse(dict(outcome), status_code=200 if outcome.get("ok") else 409)

    return router


def _admin_package(raw: bytes) -> str | JSONResponse | None:
    """The package an admin load or reload names: its optional body is ``{"package": "/abs/path"}``; a 400 for
    any other body."""
    if not raw.strip():
        return None
    try:
        body: Any = json.loads(raw)
    except ValueError:
        return invalid("body must be a JSON object", param=None)
    if not isinstance(body, dict) or set(body) - {"package"}:
        return invalid('body must be {} or {"package": "/absolute/path"}', param="package")
    package = body.get("package")
    if package is not None and not isinstance(package, str):
        return invalid("package must be a string path", param="package")
    return package


__all__ = ["create_app"]
