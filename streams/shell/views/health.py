"""GET /ragwarm/health (liveness, the canonical-prompt parameters clients must match) and
GET /ragwarm/health/ready (503 until the tables are recovered and the index matches them)."""

from __future__ import annotations

from faust.web import Request, Response

from schemas.prefix import PromptParams
from streams.handle.handlers import HandlerDeps
from streams.shell.views.bodies import Page


def health_body(app_id: str, params: PromptParams) -> dict:
    return {
        "status": "ok",
        "app_id": app_id,
        "prompt": {"digest": params.digest(), "params": params.model_dump()},
    }


def pages(p: HandlerDeps) -> dict[str, Page]:
    async def health(web, request: Request) -> Response:
        return web.json(health_body(p.settings.app_id, p.rag.prompt_params()))

    async def ready(web, request: Request) -> Response:
        r = p.readiness
        if r.index.is_set():
            return web.json({"status": "ready", "app_id": p.settings.app_id})
        return web.json({"status": "not_ready", "reason": r.reason}, status=503)

    return {"/ragwarm/health": health, "/ragwarm/health/ready": ready}
