"""GET /v1/models, health endpoints and /metrics (001 §10.1)."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.serving_api.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


async def test_models_lists_ready_aliases_in_openai_shape(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body == {
        "object": "list",
        "data": [
            {"id": a, "object": "model", "created": engine.created, "owned_by": "calctl", "max_model_len": 256}
            for a in ("model-a", "model-b")
        ],
    }


async def test_retrieve_gives_the_listed_entry_and_404_in_openai_shape(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    listed = (await client.get("/v1/models")).json()["data"]
    for entry in listed:
        r = await client.get(f"/v1/models/{entry['id']}")
        assert r.status_code == 200 and r.json() == entry
    engine.states["model-b"] = "Loading"  # not listed, so not retrievable either
    for missing in ("model-b", "model-z", "org/model-a"):
        r = await client.get(f"/v1/models/{missing}")
        assert r.status_code == 404 and r.headers["x-request-id"]
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "model_not_found" and err["param"] == "model"
        assert repr(missing) in err["message"]


@pytest.mark.parametrize("state", ["Loading", "Validating", "Warming", "Draining", "Recovering", "Failed", "Unloaded"])
async def test_models_hides_aliases_that_are_not_ready(
    client: httpx.AsyncClient, engine: FakeEngine, state: str
) -> None:
    engine.states["model-b"] = state
    r = await client.get("/v1/models")
    assert [m["id"] for m in r.json()["data"]] == ["model-a"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_model_is_404_model_not_found(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, stream: bool
) -> None:
    body = {"model": "model-z", "stream": stream, "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post(path, json=body)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "model_not_found"
    assert err["type"] == "invalid_request_error"
    assert err["param"] == "model"
    assert "model-z" in err["message"]
    assert engine.submitted == []


async def test_live_is_200_and_never_touches_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.broken = True  # any call into the engine would raise: a wedged scheduler must not fail liveness
    engine.draining = True
    r = await client.get("/health/live")
    assert r.status_code == 200
    assert r.json() == {"status": "live"}
    assert engine.calls == []


async def test_ready_is_200_when_every_alias_is_ready(client: httpx.AsyncClient) -> None:
    r = await client.get("/health/ready")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "models": {"model-a": "Ready", "model-b": "Ready"}}


async def test_ready_is_503_while_one_alias_loads(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.states["model-b"] = "Warming"
    r = await client.get("/health/ready")
    assert r.status_code == 503
    assert r.json() == {"status": "not_ready", "models": {"model-a": "Ready", "model-b": "Warming"}}


async def test_ready_is_503_while_draining(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.draining = True
    r = await client.get("/health/ready")
    assert r.status_code == 503
    assert r.json()["status"] == "draining"
    for alias in ("model-a", "model-b"):
        assert (await client.get(f"/health/ready/{alias}")).status_code == 503


async def test_ready_per_alias(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.states["model-b"] = "Recovering"
    a = await client.get("/health/ready/model-a")
    assert (a.status_code, a.json()) == (200, {"model": "model-a", "state": "Ready"})
    b = await client.get("/health/ready/model-b")
    assert (b.status_code, b.json()) == (503, {"model": "model-b", "state": "Recovering"})
    z = await client.get("/health/ready/model-z")
    assert z.status_code == 404
    assert z.json()["error"]["code"] == "model_not_found"


async def test_metrics_is_prometheus_text(client: httpx.AsyncClient) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert [f.name for f in text_string_to_metric_families(r.text)] == ["calctl_requests"]
