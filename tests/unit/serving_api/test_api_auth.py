"""API keys map to tenants (never the request body); /internal needs an admin key (001 §10.1, 000 §5 fairness)."""

from __future__ import annotations

import httpx
import pytest

from calctl.serving.api.auth import ApiSettings
from tests.unit.serving_api.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

KEYS = {"sk-alice": "tenant-a", "sk-bob": "tenant-b"}
ADMIN = "adm-root"
TEXT = {"model": "model-a", "prompt": "hi", "max_tokens": 4}
CHAT = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def settings() -> ApiSettings:
    return ApiSettings(api_keys=KEYS, admin_keys=frozenset({ADMIN}))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_401(r: httpx.Response) -> None:
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {
        "error": {
            "message": "missing or invalid API key",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("sk-mallory"),
        bearer(""),
        {"Authorization": "Basic c2stYWxpY2U6"},
        {"Authorization": "sk-alice"},
        bearer("sk-alicex"),
        bearer("sk-ali"),
        bearer(ADMIN),
    ],
    ids=["none", "wrong", "empty", "basic", "no-scheme", "longer", "prefix", "admin-key"],
)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", TEXT),
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/v1/completions", {**TEXT, "stream": True}),
    ],
)
async def test_public_endpoints_need_a_valid_key(
    client: httpx.AsyncClient, engine: FakeEngine, headers: dict[str, str], method: str, path: str, body: dict | None
) -> None:
    r = await client.request(method, path, json=body, headers=headers)
    assert_401(r)
    assert engine.submitted == []


async def test_auth_comes_before_validation_and_model_lookup(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    assert_401(await client.post("/v1/completions", json={"model": "model-z", "temperature": 9}))
    assert_401(await client.post("/v1/completions", content=b"{not json"))
    assert engine.calls == []


@pytest.mark.parametrize(
    ("headers", "tenant"),
    [
        (bearer("sk-alice"), "tenant-a"),
        (bearer("sk-bob"), "tenant-b"),
        ({"authorization": "bearer sk-bob"}, "tenant-b"),
        (bearer("  sk-alice  "), "tenant-a"),
        ({"x-api-key": "sk-bob"}, "tenant-b"),
    ],
)
@pytest.mark.parametrize(("path", "body"), [("/v1/completions", TEXT), ("/v1/chat/completions", CHAT)])
async def test_tenant_comes_from_the_key_only(
    client: httpx.AsyncClient, engine: FakeEngine, headers: dict[str, str], tenant: str, path: str, body: dict
) -> None:
    # A request cannot choose its tenant (weights and limits are configuration, 000 §5.3).
    spoof = {"user": "tenant-b" if tenant == "tenant-a" else "tenant-a", "tenant": "tenant-admin"}
    r = await client.post(path, json={**body, **spoof}, headers=headers)
    assert r.status_code == 200, r.text
    assert [req.tenant for req in engine.submitted] == [tenant]


async def test_models_with_a_valid_key(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models", headers=bearer("sk-bob"))
    assert r.status_code == 200 and len(r.json()["data"]) == 2


async def test_health_needs_no_key(client: httpx.AsyncClient) -> None:
    for path in ("/health/live", "/health/ready", "/health/ready/model-a"):
        assert (await client.get(path)).status_code == 200, path


async def test_metrics_needs_the_admin_key_by_default(client: httpx.AsyncClient) -> None:
    # /metrics names the board and the models' internal state (000 §16): internal, like /internal.
    for headers in ({}, bearer("sk-alice"), bearer("adm-wrong")):
        assert_401(await client.get("/metrics", headers=headers))
    assert (await client.get("/metrics", headers=bearer(ADMIN))).status_code == 200


# -- /internal ---------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, bearer("sk-alice"), bearer("adm-wrong")], ids=["none", "api-key", "wrong"])
async def test_internal_needs_the_admin_key(
    client: httpx.AsyncClient, engine: FakeEngine, headers: dict[str, str]
) -> None:
    assert_401(await client.delete("/internal/requests/cmpl-1", headers=headers))
    assert_401(await client.post("/internal/models/model-a/reload", headers=headers))
    assert engine.engine_cancels == [] and engine.admin_calls == []


async def test_delete_request_with_the_admin_key(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.delete("/internal/requests/cmpl-unknown", headers=bearer(ADMIN))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "request_not_found"
    assert engine.engine_cancels == ["cmpl-unknown"]


@pytest.mark.parametrize("action", ["load", "unload", "reload"])
async def test_admin_model_actions(client: httpx.AsyncClient, engine: FakeEngine, action: str) -> None:
    r = await client.post(f"/internal/models/model-b/{action}", headers=bearer(ADMIN))
    assert r.status_code == 200
    assert r.json() == {"ok": True, "alias": "model-b", "action": action}
    assert engine.admin_calls == [("model-b", action)]


async def test_admin_failure_is_409_and_unknowns_are_404(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.admin_outcome = {"ok": False, "reason": "golden mismatch"}
    r = await client.post("/internal/models/model-a/reload", headers=bearer(ADMIN))
    assert (r.status_code, r.json()["reason"]) == (409, "golden mismatch")
    r = await client.post("/internal/models/model-a/explode", headers=bearer(ADMIN))
    assert r.status_code == 404
    r = await client.post("/internal/models/model-z/load", headers=bearer(ADMIN))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert engine.admin_calls == [("model-a", "reload")]


@pytest.mark.parametrize("settings", [ApiSettings(api_keys=KEYS)], ids=["api-keys-only"])
async def test_internal_is_closed_when_api_keys_exist_but_no_admin_key(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    # API keys mean the server may listen beyond loopback; /internal (cancel anyone's request, unload models)
    # must not then be open to every client, nor to every API key.
    for headers in ({}, bearer("sk-alice")):
        r = await client.post("/internal/models/model-a/unload", headers=headers)
        assert r.status_code == 403
        assert r.json()["error"] == {
            "message": "the admin API is disabled: no admin key is configured",
            "type": "permission_error",
            "param": None,
            "code": "admin_disabled",
        }
        assert (await client.delete("/internal/requests/cmpl-1", headers=headers)).status_code == 403
    assert engine.admin_calls == [] and engine.engine_cancels == []


@pytest.mark.parametrize("settings", [ApiSettings(api_keys=KEYS)], ids=["api-keys-only"])
async def test_metrics_is_closed_with_api_keys_but_no_admin_key(client: httpx.AsyncClient) -> None:
    for headers in ({}, bearer("sk-alice")):
        r = await client.get("/metrics", headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"


@pytest.mark.parametrize(
    "settings", [ApiSettings(api_keys=KEYS, admin_keys=frozenset({ADMIN}), metrics_public=True)], ids=["public"]
)
async def test_metrics_public_is_the_operators_opt_out(client: httpx.AsyncClient) -> None:
    # `calctl serve --metrics-public`: a Prometheus scraper on a private network reads it without a key.
    assert (await client.get("/metrics")).status_code == 200
    assert_401(await client.get("/internal/trace"))  # /internal stays behind the admin key
    assert_401(await client.get("/internal/status"))
    assert (await client.get("/internal/status", headers=bearer(ADMIN))).status_code == 200


@pytest.mark.parametrize("settings", [ApiSettings()], ids=["no-keys"])
async def test_without_keys_everything_is_open(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    # No keys: the server binds to loopback only (001 §10.1), so no key is asked for.
    assert (await client.post("/v1/completions", json=TEXT)).status_code == 200
    assert (await client.post("/internal/models/model-a/reload")).status_code == 200
    assert engine.submitted[0].tenant == "default"
