"""GET /ragwarm/health: liveness and the canonical-prompt parameters clients must match."""

from __future__ import annotations

from faust.web import Request, Response

from schemas.prefix import PromptParams
from streams.handlers import Pipeline
from streams.views.bodies import Page


def health_body(app_id: str, params: PromptParams) -> dict:
    return {
        "status": "ok",
        "app_id": app_id,
        "prompt": {"digest": params.digest(), "params": params.model_dump()},
    }


def pages(p: Pipeline) -> dict[str, Page]:
    async def health(web, request: Request) -> Response:
        return web.json(health_body(p.settings.app_id, p.rag.prompt_params()))

    return {"/ragwarm/health": health}
