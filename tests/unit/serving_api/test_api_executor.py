"""/internal/models/{alias}/executor: the operator's way back to ping/pong (000 §14) is an admin action."""

from __future__ import annotations

import httpx
import pytest

from calctl.serving.api.auth import ApiSettings
from tests.unit.serving_api.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

ADMIN = "adm-root"


@pytest.fixture
def settings() -> ApiSettings:
    return ApiSettings(api_keys={"sk-alice": "tenant-a"}, admin_keys=frozenset({ADMIN}))


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-alice"}], ids=["none", "api-key"])
async def test_needs_the_admin_key(client: httpx.AsyncClient, engine: FakeEngine, headers: dict[str, str]) -> None:
    assert (await client.get("/internal/models/model-a/executor", headers=headers)).status_code == 401
    assert (
        await client.post("/internal/models/model-a/executor", json={"mode": "pingpong"}, headers=headers)
    ).status_code == 401
    assert engine.executor_calls == []


async def test_report_and_set(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.get("/internal/models/model-a/executor", headers=admin())
    assert r.status_code == 200 and r.json()["mode"] == "sync"
    r = await client.post("/internal/models/model-a/executor", json={"mode": "pingpong"}, headers=admin())
    assert r.status_code == 200 and r.json()["mode"] == "pingpong"
    assert engine.executor_calls == [("model-a", None), ("model-a", "pingpong")]
    assert engine.admin_calls == []  # not mistaken for a load/unload/reload action


@pytest.mark.parametrize("body", [{"mode": "turbo"}, {"mode": None}, {}, ["pingpong"], "pingpong"])
async def test_a_bad_body_is_400_and_reaches_no_engine(
    client: httpx.AsyncClient, engine: FakeEngine, body: object
) -> None:
    r = await client.post("/internal/models/model-a/executor", json=body, headers=admin())
    assert r.status_code == 400 and r.json()["error"]["param"] == "mode"
    assert engine.executor_calls == []


async def test_refused_by_the_configuration_is_409(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    # The fake refuses this one as the real engine refuses a mode beyond executor.max_inflight.
    r = await client.post("/internal/models/model-a/executor", json={"mode": "sync"}, headers=admin())
    assert r.status_code == 200
    engine.executor_outcome_ok = False
    r = await client.post("/internal/models/model-a/executor", json={"mode": "pingpong"}, headers=admin())
    assert r.status_code == 409
