"""POST /ragwarm/route: which ready worker to send a prompt to, by its block hashes."""

from __future__ import annotations

from collections.abc import Sequence

from faust.web import Request, Response, View

from streams.decide.logic import choose_worker
from streams.decide.records import WorkerState
from streams.handle.handlers import HandlerDeps
from streams.shell.views.bodies import BadRequest, Page, RouteBody, parse_body


def route_answer(workers: Sequence[WorkerState], hashes: Sequence[str]) -> dict:
    """The chosen worker, how many leading blocks it holds, and every ready worker."""
    live = [w for w in workers if w.ready and w.url]
    # Serving is not warmup: a busy worker still serves, so no memory threshold here.
    chosen = choose_worker(live, list(hashes), threshold=1.0)
    by_id = {w.worker_id: w for w in live}
    matched = 0
    if chosen:
        held = set(by_id[chosen].prefixes)
        matched = max((i + 1 for i, h in enumerate(hashes) if h in held), default=0)
    return {
        "worker_id": chosen,
        "url": by_id[chosen].url if chosen else None,
        "matched_blocks": matched,
        "workers": [{"worker_id": w.worker_id, "url": w.url} for w in live],
    }


def pages(p: HandlerDeps) -> dict[str, Page]:
    class Route(View):
        """POST {"block_hashes": [...]} -> the worker to send that prompt to."""

        async def post(self, request: Request) -> Response:
            try:
                body = parse_body(await request.read(), RouteBody)
            except BadRequest as exc:
                return self.error(exc.status, exc.message)
            return self.json(route_answer(p.live_workers(), body.block_hashes))

    return {"/ragwarm/route": Route}
