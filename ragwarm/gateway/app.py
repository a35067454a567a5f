"""The gateway's HTTP server (aiohttp): OpenAI routes over `AsyncRagClient`, health, the command."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import click
from aiohttp import web

from ragwarm.client.arag import AsyncRagClient, PartialAnswerLost
from ragwarm.client.independent import OwnPath
from ragwarm.client.rag import Answer, PreparedQuery
from ragwarm.client.settings import ClientSettings
from ragwarm.client.view import ViewRules
from ragwarm.client.wire import ClientError, NoWorker, RequestRejected, StreamsUnavailable
from ragwarm.gateway.metrics import CONTENT_TYPE, UNMATCHED, GatewayMetrics
from ragwarm.gateway.protocol import (
    DONE,
    ChatRequest,
    CompletionRequest,
    GatewayError,
    Keys,
    Limits,
    Reply,
    Served,
    models_body,
    parse_request,
    sse,
    tenant_for,
)
from ragwarm.gateway.settings import GatewaySettings
from ragwarm.gateway.stops import StopCut

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Opener = Callable[[], Awaitable[AsyncRagClient]]


@dataclass
class GatewayState:
    """What the handlers share: settings, keys, the client once it is open, why it is not."""

    settings: GatewaySettings
    client_settings: ClientSettings
    model_id: str
    opener: Opener
    client: AsyncRagClient | None = None
    not_ready: str = "starting"
    started: int = field(default_factory=lambda: int(time.time()))
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)

    @property
    def keys(self) -> Keys:
        return Keys({t: k.get_secret_value() for t, k in self.settings.keys.items()},
                    self.settings.operator_key.get_secret_value()
                    if self.settings.operator_key else None,
                    self.settings.tenant_header, self.client_settings.tenant)

    @property
    def served(self) -> Served:
        return Served(self.model_id, tuple(self.settings.model_aliases))

    @property
    def limits(self) -> Limits:
        return Limits(self.settings.max_tokens, self.settings.max_question_chars,
                      self.client_settings.temperature)

    def live_client(self) -> AsyncRagClient:
        if self.client is None:
            raise GatewayError(503, f"the gateway is not ready: {self.not_ready}",
                               kind="server_error", code="not_ready")
        return self.client


STATE: web.AppKey[GatewayState] = web.AppKey("ragwarm_gateway_state")
OPEN_PATHS = ("/health",)


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda b: json.dumps(b, default=str))


def client_error(exc: ClientError) -> GatewayError:
    """A client failure as the HTTP error an OpenAI SDK understands."""
    if isinstance(exc, StreamsUnavailable | NoWorker):
        return GatewayError(503, str(exc), kind="server_error", code="unavailable")
    if isinstance(exc, RequestRejected):
        return GatewayError(400, str(exc))
    return GatewayError(502, str(exc), kind="server_error", code="upstream_failed")


def measure(metrics: GatewayMetrics) -> Any:
    """Count every request by route and status, and time it (outermost, so errors count)."""

    @web.middleware
    async def timed(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else UNMATCHED
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            metrics.request(route, status, time.perf_counter() - started)

    return timed


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure answers OpenAI's JSON error shape."""
    try:
        return await handler(request)
    except GatewayError as exc:
        return json_response(exc.body(), exc.status)
    except ClientError as exc:
        err = client_error(exc)
        return json_response(err.body(), err.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        return json_response(GatewayError(exc.status, exc.reason, kind=kind).body(), exc.status)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_response(GatewayError(500, "internal error", kind="server_error").body(), 500)


class Handlers:
    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def live(self, request: web.Request) -> web.Response:
        return json_response({"status": "live"})

    async def ready(self, request: web.Request) -> web.Response:
        if self.state.client is None:
            return json_response({"status": "not ready", "reason": self.state.not_ready}, 503)
        return json_response({"status": "ready", "model": self.state.model_id})

    async def health(self, request: web.Request) -> web.Response:
        """vLLM's `/health`: 200 with no body once requests can be answered."""
        if self.state.client is None:
            return json_response({"status": "not ready", "reason": self.state.not_ready}, 503)
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.state.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        tenant_for(self.state.keys, request.headers)
        return json_response(models_body(self.state.served, self.state.started))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, ChatRequest, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, CompletionRequest, chat=False)

    async def _answer(self, request: web.Request, kind: type[ChatRequest | CompletionRequest],
                      chat: bool) -> web.StreamResponse:
        tenant = tenant_for(self.state.keys, request.headers)
        body = await _json(request)
        req = parse_request(kind, body, self.state.served, self.state.limits)
        client = self.state.live_client()
        started = time.perf_counter()  # the answer's time to first token counts retrieval
        prepared = await client.prepare(req.question(), tenant)
        reply = Reply.new(chat, req.model)  # an alias is answered under its own name (vLLM)
        if req.stream:
            return await _stream(request, self.state, prepared, req, reply, started)
        answer = await client.ask(prepared, req.token_limit(), started=started,
                                  temperature=req.temperature)
        self.state.metrics.answered(answer, stream=False)
        cut = StopCut(req.stops())
        text = cut.cut(answer.text)
        return json_response(reply.body(replace(
            answer, text=text, finish_reason=cut.finish_reason(answer.finish_reason))))


async def _stream(request: web.Request, state: GatewayState, prepared: PreparedQuery,
                  req: ChatRequest | CompletionRequest, reply: Reply,
                  started: float) -> web.StreamResponse:
    """SSE chunks as the worker streams; an error after the headers is an error event."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    if reply.chat:
        await response.write(sse(reply.chunk("", role=True)))

    cut = StopCut(req.stops())

    async def forward(text: str) -> None:
        if out := cut.feed(text):
            await response.write(sse(reply.chunk(out)))

    try:
        answer: Answer = await state.live_client().ask(
            prepared, req.token_limit(), forward, started, temperature=req.temperature,
            restart_on_retry=False)
        state.metrics.answered(answer, stream=True)
        if rest := cut.flush():
            await response.write(sse(reply.chunk(rest)))
        await response.write(sse(reply.chunk("", cut.finish_reason(answer.finish_reason))))
        if req.include_usage:
            await response.write(sse(reply.usage_chunk(answer)))
    except PartialAnswerLost as exc:
        state.metrics.stream_errors.inc()
        await response.write(sse(GatewayError(502, str(exc), kind="server_error").body()))
    except ClientError as exc:
        state.metrics.stream_errors.inc()
        await response.write(sse(client_error(exc).body()))
    except ConnectionResetError:
        log.info("the app went away during a stream")
        return response
    await response.write(DONE)
    await response.write_eof()
    return response


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError):
        raise GatewayError(400, "the request body is not valid JSON") from None


def auth(state: GatewayState) -> Any:
    """Refuse a wrong key before reading the body (health stays open for probes)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(OPEN_PATHS):
            tenant_for(state.keys, request.headers)
        return await handler(request)

    return check


def build_app(state: GatewayState) -> web.Application:
    """The aiohttp application; the client is opened in the background when it starts."""
    app = web.Application(middlewares=[measure(state.metrics), errors, auth(state)],
                          client_max_size=1 << 20)
    app[STATE] = state
    h = Handlers(state)
    app.add_routes([
        web.get("/health", h.health),
        web.get("/health/live", h.live),
        web.get("/health/ready", h.ready),
        web.get("/metrics", h.metrics),
        web.get("/v1/models", h.models),
        web.post("/v1/chat/completions", h.chat),
        web.post("/v1/completions", h.completions),
    ])
    tasks: set[asyncio.Task] = set()

    async def start(app: web.Application) -> None:
        task = asyncio.create_task(_open_until_ready(state))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def stop(app: web.Application) -> None:
        for task in list(tasks):
            task.cancel()
        if state.client is not None:
            await state.client.aclose()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


async def _open_until_ready(state: GatewayState) -> None:
    """Open the client, retrying while the streams app is not up yet (any start order works)."""
    while state.client is None:
        try:
            state.client = await state.opener()
            log.info("gateway ready: model %s", state.model_id)
        except StreamsUnavailable as exc:
            state.not_ready = str(exc)
            await asyncio.sleep(state.settings.open_retry_s)
        except Exception as exc:  # noqa: BLE001 - a bad start must show on /health/ready
            state.not_ready = f"{type(exc).__name__}: {exc}"
            log.exception("gateway client failed to open")
            await asyncio.sleep(state.settings.open_retry_s)


def own_path(settings: GatewaySettings) -> OwnPath:
    """What the gateway's client reads itself, from the gateway's settings."""
    secret = settings.worker_events_secret
    rules = ViewRules(secret.get_secret_value() if secret else None, settings.worker_stale_s,
                      settings.view_quiet_s)
    return OwnPath(settings.retrieval, rules if settings.follow_workers else None,
                   settings.view_replay_s)


@click.command()
@click.option("--host", default=None, help="Listen address (RAGWARM_GATEWAY_HOST).")
@click.option("--port", type=int, default=None, help="Port (RAGWARM_GATEWAY_PORT).")
@click.option("--insecure", is_flag=True,
              help="Start with no key beyond loopback (RAGWARM_INSECURE); docs/security.md.")
def gateway(host: str | None, port: int | None, insecure: bool) -> None:
    """The OpenAI-compatible gateway: retrieval, canonical prompt, routing to a warm worker."""
    from ragwarm.client.independent import open_gateway_client
    from ragwarm.client.rag import quiet_http_logs
    from ragwarm.secure import check_start, open_keys, unsigned_events
    from ragwarm.settings import ModelSettings, SecuritySettings

    quiet_http_logs()
    settings = GatewaySettings()
    exposures = open_keys("gateway", settings.operator_key is not None, bool(settings.keys))
    if settings.follow_workers:
        exposures += unsigned_events("gateway", settings.worker_events_secret is not None)
    check_start("gateway", exposures, host or settings.host,
                insecure or SecuritySettings().insecure)
    models = ModelSettings()
    client_settings = ClientSettings()
    state = GatewayState(settings, client_settings, models.llm_name,
                         lambda: open_gateway_client(own_path(settings), client_settings,
                                                     models))
    web.run_app(build_app(state), host=host or settings.host, port=port or settings.port,
                access_log=None, print=lambda msg: log.info("%s", msg))
