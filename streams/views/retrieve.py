"""POST /ragwarm/retrieve: top-k chunks with text, for clients that reach the store through us."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams.handlers import HandlerDeps
from streams.views.bodies import BadRequest, Page, RetrieveBody, parse_body


def pages(p: HandlerDeps) -> dict[str, Page]:
    class Retrieve(View):
        """POST {"question": str, "tenant": str?, "k": int?} -> top-k chunks with text."""

        async def post(self, request: Request) -> Response:
            try:
                body = parse_body(await request.read(), RetrieveBody)
            except BadRequest as exc:
                return self.error(exc.status, exc.message)
            chunks = await p.blocking(p.rag.search, body.question, body.tenant, body.k)
            return self.json({"chunks": chunks})

    return {"/ragwarm/retrieve": Retrieve}
