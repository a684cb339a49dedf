"""API keys: who a request is (its tenant) and whether it may use ``/internal`` (001 §10.1).

Keys come from the server's settings, never from the request body; a tenant's
weight is configuration (000 §5.3). Comparison is constant-time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from fastapi import Request

from calctl.serving.api.errors import AdminDisabled, Unauthorized
from calctl.serving.api.guard import DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class ApiSettings:
    api_keys: dict[str, str] = field(default_factory=dict)  # key -> tenant
    admin_keys: frozenset[str] = frozenset()
    default_tenant: str = "default"
    chat_default_max_tokens: int | None = None  # None: up to the context limit
    # /metrics carries board and per-model internal state (000 §16): behind the admin check like /internal
    # unless the operator opts out for a scraper on a private network (`calctl serve --metrics-public`).
    metrics_public: bool = False
    # The largest request body read (413 past it, while it arrives; calctl.serving.api.guard). ``calctl serve
    # --max-body-mb`` or ``api.max_body_mb`` in the dual-model config; docs/serve.md "Request size".
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


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


class Auth:
    """The two checks, as FastAPI dependencies: ``Depends(auth.tenant)`` and ``Depends(auth.admin)``.

    ``async`` on purpose: FastAPI runs a plain-function dependency in a worker thread, a thread hop on
    every request's path to its first token for a check that never blocks."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings

    async def tenant(self, request: Request) -> str:
        s = self.settings
        if not s.api_keys:
            return s.default_tenant
        key = _match_key(_bearer(request), s.api_keys)
        if key is None:
            raise Unauthorized()
        return s.api_keys[key]

    async def admin(self, request: Request) -> None:
        s = self.settings
        if s.admin_keys:
            if _match_key(_bearer(request), s.admin_keys) is None:
                raise Unauthorized()
        elif s.api_keys:
            # API keys but no admin key: the server may listen beyond loopback, so /internal (cancel anyone's
            # request, unload a model) stays closed rather than open to every client. With no keys at all
            # the server binds to loopback only (001 §10.1) and /internal is open to local callers.
            raise AdminDisabled()


__all__ = ["ApiSettings", "Auth"]
