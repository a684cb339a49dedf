"""Fixtures for the HTTP-layer tests: a fake engine, the app over it and an in-process client (no sockets).

Every JSON or SSE body the ``client`` fixture receives is scanned for chip ids,
paths and addresses (``api_harness.scan_body``), so the leak rule is checked by
every test rather than by one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from calctl.serving.api.app import create_app
from calctl.serving.api.auth import ApiSettings
from tests.unit.serving_api.api_harness import scan_body
from tests.unit.serving_api.fake_engine import FakeEngine


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def settings() -> ApiSettings:
    return ApiSettings()


@pytest.fixture
def app(engine: FakeEngine, settings: ApiSettings):
    return create_app(engine, settings)


async def _scan(response: httpx.Response) -> None:
    await response.aread()
    scan_body(response.headers.get("content-type", ""), response.content)


@pytest.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://testserver", timeout=10, event_hooks={"response": [_scan]}
    ) as c:
        yield c
