"""GET /ragwarm/health (liveness, the canonical-prompt parameters clients must match) and
GET /ragwarm/health/ready (503 until the tables are recovered, the index matches them and the
RAG layer is loaded)."""

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


def ready_body(app_id: str, index_ready: bool, reason: str, loading: str | None) -> dict:
    """The ready probe's answer: ready once the index is checked and nothing is loading; the
    reason names each part still pending (Faust starts while the models load, so both may)."""
    if index_ready and loading is None:
        return {"status": "ready", "app_id": app_id}
    pending = [] if index_ready else [reason]
    if loading is not None:
        pending.append(f"loading the {loading}" if loading != "failed"
                       else "the RAG layer failed to load (see the log)")
    return {"status": "not_ready", "reason": "; ".join(pending), "loading": loading}


def pages(p: HandlerDeps) -> dict[str, Page]:
    async def health(web, request: Request) -> Response:
        return web.json(health_body(p.settings.app_id, p.rag.prompt_params()))

    async def ready(web, request: Request) -> Response:
        r = p.readiness
        body = ready_body(p.settings.app_id, r.index.is_set(), r.reason, p.loading())
        return web.json(body, status=200 if body["status"] == "ready" else 503)

    return {"/ragwarm/health": health, "/ragwarm/health/ready": ready}
