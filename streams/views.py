"""Web views on the Faust app: routing for RAG clients, state for operators, retrieval."""

from __future__ import annotations

import json

from faust.web import Request, Response, View

from streams.handlers import Pipeline
from streams.logic import choose_worker, holders_of
from streams.records import PrefixState

MAX_HASHES = 4096
MAX_K = 50


def register_views(app, p: Pipeline) -> None:
    _health_views(app, p)
    _state_views(app, p)
    _serving_views(app, p)


def _health_views(app, p: Pipeline) -> None:
    @app.page("/ragwarm/health")
    async def health(web, request: Request) -> Response:
        return web.json({"status": "ok", "app_id": p.settings.app_id})

    @app.page("/ragwarm/health/ready")
    async def ready(web, request: Request) -> Response:
        """200 once the tables are recovered and the index matches them; 503 before."""
        r = p.readiness
        if r.index.is_set():
            return web.json({"status": "ready", "app_id": p.settings.app_id})
        return web.json({"status": "not_ready", "reason": r.reason}, status=503)


def _state_views(app, p: Pipeline) -> None:
    @app.page("/ragwarm/stats")
    async def stats(web, request: Request) -> Response:
        return web.json(
            {
                "counters": dict(p.stats),
                "docs": len(p.tables.docs),
                "prefixes": len(p.tables.prefixes),
                "workers": len(p.tables.workers),
                "hot": len(p.tracker.hot),
            }
        )

    @app.page("/ragwarm/workers")
    async def workers(web, request: Request) -> Response:
        rows = [
            w.model_dump(mode="json") | {"mem_ratio": w.mem_ratio, "entries_warm": len(w.prefixes)}
            for w in p.live_workers()
        ]
        return web.json({"workers": rows})

    _hot_view(app, p)


def _hot_view(app, p: Pipeline) -> None:
    @app.page("/ragwarm/hot")
    async def hot(web, request: Request) -> Response:
        now = p.clock()
        return web.json(
            {
                "hot": [
                    {
                        "prefix_hash": op.prefix_hash,
                        "tenant": op.tenant,
                        "question": op.question,
                        "tokens": len(op.token_ids),
                    }
                    for op in p.tracker.hot.values()
                ],
                "top_prefixes": [
                    {"prefix_hash": h, "count": c, "question": pl.question}
                    for h, c, pl in p.tracker.ranked(now)[:20]
                ],
                "top_questions": [
                    {"tenant": k[0], "question": k[1], "count": c}
                    for k, c, _ in p.tracker.questions.top(now, 20)
                ],
            }
        )

    @app.page("/ragwarm/docs")
    async def docs(web, request: Request) -> Response:
        """Every document's version and chunk hashes (what replays must rebuild)."""
        return web.json(
            {
                "docs": {k: v for k, v in p.tables.docs.items()},
                "doc_prefixes": {k: v for k, v in p.tables.doc_prefixes.items() if v},
            }
        )

    @app.page("/ragwarm/prefixes/{prefix_hash}")
    async def prefix(web, request: Request, prefix_hash: str) -> Response:
        raw = p.tables.prefixes.get(prefix_hash)
        state = PrefixState.model_validate(raw) if raw else None
        return web.json(
            {
                "prefix_hash": prefix_hash,
                "holders": holders_of(prefix_hash, p.live_workers()),
                "state": state.model_dump(mode="json", exclude={"token_ids"}) if state else None,
            }
        )


def _serving_views(app, p: Pipeline) -> None:
    @app.page("/ragwarm/route")
    class Route(View):
        """POST {"block_hashes": [...]} -> the worker to send that prompt to."""

        async def post(self, request: Request) -> Response:
            body, error = await _json_body(self, request)
            if error:
                return error
            hashes = body.get("block_hashes")
            if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
                return self.error(400, "block_hashes: expected a list of strings")
            if len(hashes) > MAX_HASHES:
                return self.error(400, f"block_hashes: at most {MAX_HASHES}")
            live = [w for w in p.live_workers() if w.ready and w.url]
            # Serving is not warmup: a busy worker still serves, so no memory threshold here.
            chosen = choose_worker(live, hashes, threshold=1.0)
            by_id = {w.worker_id: w for w in live}
            matched = 0
            if chosen:
                held = set(by_id[chosen].prefixes)
                matched = max((i + 1 for i, h in enumerate(hashes) if h in held), default=0)
            return self.json(
                {
                    "worker_id": chosen,
                    "url": by_id[chosen].url if chosen else None,
                    "matched_blocks": matched,
                    "workers": [{"worker_id": w.worker_id, "url": w.url} for w in live],
                }
            )

    @app.page("/ragwarm/retrieve")
    class Retrieve(View):
        """POST {"question": str, "tenant": str?, "k": int?} -> top-k chunks with text."""

        async def post(self, request: Request) -> Response:
            body, error = await _json_body(self, request)
            if error:
                return error
            question, tenant, k = body.get("question"), body.get("tenant"), body.get("k", 3)
            if not isinstance(question, str) or not question.strip():
                return self.error(400, "question: expected a non-empty string")
            if len(question) > 8192:
                return self.error(400, "question: longer than 8192 characters")
            if tenant is not None and not isinstance(tenant, str):
                return self.error(400, "tenant: expected a string")
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
                return self.error(400, f"k: expected an integer in 1..{MAX_K}")
            chunks = await p.blocking(p.rag.search, question, tenant, k)
            return self.json({"chunks": chunks})


async def _json_body(view: View, request: Request) -> tuple[dict, Response | None]:
    raw = await request.read()
    if len(raw) > 1_000_000:
        return {}, view.error(413, "body larger than 1 MB")
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        return {}, view.error(400, f"body is not JSON: {exc}")
    if not isinstance(body, dict):
        return {}, view.error(400, "body: expected a JSON object")
    return body, None
