"""POST /ragwarm/warmup: warm the hot set now (what a Kubernetes CronJob calls before a peak)."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams.handle.handlers import HandlerDeps
from streams.shell.views.bodies import Page


async def warm_hot_set(p: HandlerDeps, reason: str = "scheduled") -> int:
    """Send a warm op for every hot prefix this instance tracks; how many were sent."""
    ops = list(p.tracker.hot.values())
    for op in ops:
        await p.out.op(op.model_copy(update={"reason": reason}))
    return len(ops)


def pages(p: HandlerDeps) -> dict[str, Page]:
    class Warmup(View):
        """POST (no body) -> {"sent": n}: the hot prefixes of this instance, warmed again."""

        async def post(self, request: Request) -> Response:
            return self.json({"sent": await warm_hot_set(p)})

    return {"/ragwarm/warmup": Warmup}
