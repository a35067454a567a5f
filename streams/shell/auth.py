"""Who may call the web views: bearer keys per tenant, and a bound on concurrent retrievals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from schemas.auth import Forbidden, Grant, KeyRing

# /ragwarm/health and /ragwarm/health/ready for the probes; /metrics for Prometheus (counts
# and topic names only, no tenant data).
OPEN_PATHS = ("/ragwarm/health", "/metrics")
# What a tenant-bound key may call; everything else (tables, workers, hot set, Faust's own
# pages) lists every tenant's state and needs an operator key.
TENANT_PATHS = ("/ragwarm/retrieve", "/ragwarm/route")
GRANT: web.RequestKey[Grant] = web.RequestKey("ragwarm_grant", Grant)
T = TypeVar("T")


def _error(status: int, message: str, **headers: str) -> web.Response:
    body = json.dumps({"error": message})
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


def auth_middleware(ring: KeyRing) -> Any:
    """An aiohttp middleware: 401 without a known key, 403 for a tenant key off its paths."""

    @web.middleware
    async def auth(request: web.Request, handler: Callable) -> web.StreamResponse:
        if request.path.startswith(OPEN_PATHS):
            return await handler(request)
        grant = ring.grant(request.headers.get("Authorization"))
        if grant is None:
            return _error(401, "missing or invalid bearer token", **{"WWW-Authenticate": "Bearer"})
        if not grant.operator and not request.path.startswith(TENANT_PATHS):
            return _error(403, "an operator key is required")
        request[GRANT] = grant
        return await handler(request)

    return auth


def install_auth(app: Any, ring: KeyRing) -> None:
    """Guard every view of the Faust `app` (before it starts); an empty ring leaves them open."""
    if ring.enabled:
        app.web.web_app.middlewares.append(auth_middleware(ring))


def request_tenant(request: Any, claimed: object) -> str:
    """The tenant a retrieval acts for; raises ValueError (400) or `Forbidden` (403)."""
    if claimed is not None and (not isinstance(claimed, str) or not claimed):
        raise ValueError("tenant: expected a non-empty string")
    grant: Grant | None = request.get(GRANT)
    tenant = KeyRing.tenant_for(grant, claimed) if grant else claimed  # type: ignore[arg-type]
    if tenant is None:
        raise ValueError("tenant: required")
    return tenant


class Busy(Exception):
    """Every retrieval slot stayed taken for the whole wait."""


class Gate:
    """At most `limit` retrievals at once, so a flood of them cannot starve indexing."""

    def __init__(self, limit: int, wait_s: float) -> None:
        self._slots = asyncio.Semaphore(limit)
        self.wait_s = wait_s

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        try:
            await asyncio.wait_for(self._slots.acquire(), self.wait_s)
        except TimeoutError:
            raise Busy(f"retrieval is busy; retry in a few seconds (>{self.wait_s:g} s)") from None
        try:
            return await work()
        finally:
            self._slots.release()


__all__ = ["Busy", "Forbidden", "Gate", "install_auth", "request_tenant"]
