"""Read-only views of the app's state for operators: stats, workers, hot set, docs, prefixes."""

from __future__ import annotations

from faust.web import Request, Response

from streams.decide.logic import holders_of
from streams.handle.handlers import HandlerDeps
from streams.shell.rebalance import flow_state
from streams.shell.views.bodies import Page

TOP = 20


def stats_body(p: HandlerDeps) -> dict:
    return {
        "counters": dict(p.stats),
        "docs": len(p.tables.docs),
        "prefixes": len(p.tables.prefixes),
        "workers": len(p.tables.workers),
        "hot": len(p.tracker.hot),
        # This instance's share of the rag.queries partitions (0 before its first assignment).
        "owned_share": p.owned_share(),
    }


def workers_body(p: HandlerDeps) -> dict:
    rows = [
        w.model_dump(mode="json") | {"mem_ratio": w.mem_ratio, "entries_warm": len(w.prefixes)}
        for w in p.live_workers()
    ]
    return {"workers": rows}


def hot_body(p: HandlerDeps) -> dict:
    now = p.clock()
    hot = [
        {"prefix_hash": op.prefix_hash, "tenant": op.tenant, "question": op.question,
         "tokens": len(op.token_ids)}
        for op in p.tracker.hot.values()
    ]
    top_prefixes = [
        {"prefix_hash": prefix_hash, "count": count, "question": op.question}
        for prefix_hash, count, op in p.tracker.ranked(now)[:TOP]
    ]
    top_questions = [
        {"tenant": key[0], "question": key[1], "count": count}
        for key, count in p.tracker.top_questions(now, TOP)
    ]
    return {"hot": hot, "top_prefixes": top_prefixes, "top_questions": top_questions}


def docs_body(p: HandlerDeps) -> dict:
    """Every document's version and chunk hashes (what replays must rebuild)."""
    return {
        "docs": dict(p.tables.docs.items()),
        "doc_prefixes": {k: v for k, v in p.tables.doc_prefixes.items() if v},
    }


def prefix_body(p: HandlerDeps, prefix_hash: str) -> dict:
    state = p.tables.prefix_states.get(prefix_hash)
    return {
        "prefix_hash": prefix_hash,
        "holders": holders_of(prefix_hash, p.live_workers()),
        "state": state.model_dump(mode="json", exclude={"token_ids"}) if state else None,
    }


def pages(p: HandlerDeps) -> dict[str, Page]:
    async def stats(web, request: Request) -> Response:
        return web.json(stats_body(p) | {"consumer": flow_state(web.app)})

    async def workers(web, request: Request) -> Response:
        return web.json(workers_body(p))

    async def hot(web, request: Request) -> Response:
        return web.json(hot_body(p))

    async def docs(web, request: Request) -> Response:
        return web.json(docs_body(p))

    async def prefix(web, request: Request, prefix_hash: str) -> Response:
        return web.json(prefix_body(p, prefix_hash))

    return {
        "/ragwarm/stats": stats,
        "/ragwarm/workers": workers,
        "/ragwarm/hot": hot,
        "/ragwarm/docs": docs,
        "/ragwarm/prefixes/{prefix_hash}": prefix,
    }
