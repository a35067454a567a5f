"""POST /ragwarm/retrieve: top-k chunks with text, for clients that reach the store through us."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams.handle.handlers import HandlerDeps
from streams.shell.auth import Busy, Forbidden, Gate, request_tenant
from streams.shell.views.bodies import BadRequest, Page, RetrieveBody, parse_body


def pages(p: HandlerDeps) -> dict[str, Page]:
    gate = Gate(p.settings.retrieve_concurrency, p.settings.retrieve_wait_s)

    class Retrieve(View):
        """POST {"question": str, "tenant": str, "k": int?} -> top-k chunks of that tenant.

        The tenant may be left out with a tenant-bound key (the key's tenant is used).
        """

        async def post(self, request: Request) -> Response:
            try:
                body = parse_body(await request.read(), RetrieveBody)
                tenant = request_tenant(request, body.tenant)
                chunks = await gate.run(
                    lambda: p.blocking(p.rag.search, body.question, tenant, body.k)
                )
            except BadRequest as exc:
                return self.error(exc.status, exc.message)
            except ValueError as exc:
                return self.error(400, str(exc))
            except Forbidden as exc:
                return self.error(403, str(exc))
            except Busy as exc:
                return self.error(429, str(exc))
            return self.json({"chunks": chunks})

    return {"/ragwarm/retrieve": Retrieve}
