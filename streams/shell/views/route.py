"""POST /ragwarm/route: which ready worker to send a prompt to, by its block hashes."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams.decide.fleet import route_answer
from streams.handle.handlers import HandlerDeps
from streams.shell.views.bodies import BadRequest, Page, RouteBody, parse_body


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
