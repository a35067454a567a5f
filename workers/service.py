"""The worker's HTTP API (aiohttp): OpenAI-style completions, prefill, health, metrics, cache."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

from aiohttp import web

from schemas.auth import Forbidden, Grant, KeyRing
from workers.api import (
    DONE,
    ApiError,
    CompletionRequest,
    PrefillRequest,
    check_completion,
    check_prompt,
    check_spans_of,
    completion_body,
    completion_id,
    error_body,
    parse,
    sse,
    usage,
    usage_chunk,
)
from workers.commands import BrokerUnavailable
from workers.engines.protocol import GenerationResult, GenerationStep
from workers.kv.cache import WarmupRefused
from workers.kv.chunk_kv import ChunkSpan
from workers.metrics import CONTENT_TYPE, WorkerMetrics
from workers.runtime import WorkerRuntime, chunk_keys

log = logging.getLogger(__name__)

OPEN_PATHS = ("/health/",)
# What only operator keys see: the cache listing names every tenant's prefixes.
OPERATOR_PATHS = ("/v1/cache",)
GRANT: web.RequestKey[Grant] = web.RequestKey("ragwarm_grant", Grant)
STATE: web.AppKey[ServiceState] = web.AppKey("ragwarm_worker_state")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Lifecycle(Protocol):
    """Brings a worker up (blocking: load model, connect, warm) and takes it down."""

    def start(self, report: Callable[[str], None]) -> WorkerRuntime: ...

    def stop(self) -> None: ...


@dataclass
class ServiceConfig:
    """What the HTTP layer needs from the worker's settings."""

    worker_id: str
    api_key: str | None = None
    keyring: KeyRing | None = None  # tenant-bound keys; `api_key` alone is the operator key
    heartbeat_s: float = 5.0
    max_body_bytes: int = 1 << 20


@dataclass
class ServiceState:
    """Mutable state shared by the handlers: the runtime appears once boot is done."""

    config: ServiceConfig
    metrics: WorkerMetrics
    lifecycle: Lifecycle
    runtime: WorkerRuntime | None = None
    ready: bool = False
    reason: str = "starting"
    failed: bool = False
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="engine")
    )
    # Heartbeats have their own thread: with every engine thread busy generating, a worker
    # must still say it is alive, or the fleet routes around it as gone.
    heartbeat_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="heartbeat")
    )
    tasks: list[asyncio.Task] = field(default_factory=list)

    def live_runtime(self) -> WorkerRuntime:
        if not self.ready or self.runtime is None:
            raise ApiError(503, f"worker not ready: {self.reason}", kind="service_unavailable")
        return self.runtime


def json_response(body: Any, status: int = 200, **kw: Any) -> web.Response:
    return web.json_response(body, status=status, dumps=partial(json.dumps, default=str), **kw)


# -- middlewares ---------------------------------------------------------------------


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure answers OpenAI's JSON error shape."""
    try:
        return await handler(request)
    except ApiError as exc:
        return json_response(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        keep = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        return json_response(error_body(exc.reason, kind), exc.status, headers=keep)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_response(error_body("internal error", "server_error"), 500)


def key_auth(ring: KeyRing) -> Any:
    """Every path but the health probes needs a key; the request carries its `Grant`."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(OPEN_PATHS):
            grant = ring.grant(request.headers.get("Authorization"))
            if grant is None:
                raise ApiError(401, "missing or invalid bearer token", kind="authentication_error")
            if request.path.startswith(OPERATOR_PATHS) and not grant.operator:
                raise ApiError(403, "an operator key is required", kind="permission_error")
            request[GRANT] = grant
        return await handler(request)

    return auth


def bind_tenant(request: web.Request, req: CompletionRequest | PrefillRequest) -> None:
    """Act for the tenant the key grants: an unclaimed tenant is the key's, a foreign one 403."""
    grant: Grant | None = request.get(GRANT)
    if grant is None:
        return
    claimed = req.tenant if {"tenant", "cache_salt"} & req.model_fields_set else None
    try:
        req.tenant = KeyRing.tenant_for(grant, claimed) or req.tenant
    except Forbidden as exc:
        raise ApiError(403, str(exc), kind="permission_error", param="tenant") from None


# -- handlers ------------------------------------------------------------------------


class Handlers:
    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def live(self, request: web.Request) -> web.Response:
        return json_response({"status": "live", "worker_id": self.state.config.worker_id})

    async def ready(self, request: web.Request) -> web.Response:
        s = self.state
        if s.ready:
            return json_response({"status": "ready", "worker_id": s.config.worker_id})
        return json_response(
            {"status": "failed" if s.failed else "not_ready", "reason": s.reason}, 503
        )

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.state.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        runtime = self.state.live_runtime()
        card = {
            "id": runtime.engine.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "ragwarm",
            "max_model_len": runtime.limits.context_tokens,
        }
        return json_response({"object": "list", "data": [card]})

    async def cache(self, request: web.Request) -> web.Response:
        s = self.state
        snap = s.runtime.snapshot if s.runtime is not None else None
        body: dict[str, Any] = {"worker_id": s.config.worker_id, "ready": s.ready}
        if s.runtime is not None and snap is not None:
            cache = s.runtime.engine.cache
            body.update(
                model=s.runtime.engine.model_id,
                block_size=s.runtime.engine.block_size,
                policy=cache.policy_name,
                bytes_used=snap.mem_used,
                bytes_total=snap.mem_total,
                pinned_bytes=snap.pinned_bytes,
                warm_bytes_budget=cache.budget.warm_bytes,
                max_entries=cache.budget.max_entries,
                entries=len(snap.entries),
                blocks=snap.blocks,
                tier={"prefixes": len(snap.tier_prefixes), "bytes": snap.tier_bytes},
                items=list(snap.entries),
            )
        return json_response(body)

    async def prefill(self, request: web.Request) -> web.Response:
        runtime = self.state.live_runtime()
        req: PrefillRequest = parse(PrefillRequest, await _json(request))
        bind_tenant(request, req)
        ids = await self._tokens(runtime, req.source())
        check_prompt(ids, runtime.limits)
        job = partial(
            runtime.prefill,
            ids,
            tenant=req.tenant,
            chunk_refs=chunk_keys(req.chunk_refs),
            ttl_s=req.ttl_s,
            pin=req.pin,
            source="api",
        )
        try:
            runtime.check_threshold()  # as for a command: the API is no more trusted (issue 41)
            result = await asyncio.get_running_loop().run_in_executor(self.state.executor, job)
        except WarmupRefused as exc:
            raise ApiError(409, f"prefill refused: {exc.reason}", kind="warmup_refused") from None
        return json_response(
            {
                "prefix_hash": result.prefix_hash, "prompt_tokens": len(ids),
                "prefix_tokens": result.n_tokens,
                "bytes": result.nbytes,
                "computed_tokens": result.computed_tokens,
                "evicted": [e.prefix_hash for e in result.evicted],
                "elapsed_ms": round(result.elapsed_s * 1000, 3),
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        runtime = self.state.live_runtime()
        req: CompletionRequest = parse(CompletionRequest, await _json(request))
        bind_tenant(request, req)
        check_completion(req, runtime.limits)
        if req.model is not None and req.model != runtime.engine.model_id:
            raise ApiError(
                404, f"the model `{req.model}` does not exist", kind="NotFoundError", param="model"
            )
        ids = await self._tokens(runtime, prompt := req.single_prompt())
        check_prompt(ids, runtime.limits, max_tokens=req.max_tokens)
        spans = check_spans_of(req, prompt, len(ids))
        run = _Generation(self.state, runtime, ids, req, arrived, spans)
        if req.stream:
            return await self._stream(request, run)
        return await self._complete(run)

    async def _tokens(self, runtime: WorkerRuntime, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.state.executor, runtime.engine.tokenize, prompt)

    async def _complete(self, run: _Generation) -> web.Response:
        text: list[str] = []
        result: GenerationResult | None = None
        async with aclosing(run.steps()) as steps:
            async for step in steps:
                text.append(step.text)
                result = step.result or result
        assert result is not None
        body = completion_body(
            run.cid, run.model, "".join(text), result.finish_reason, run.usage(result)
        )
        if run.req.return_token_ids:
            body["choices"][0]["token_ids"] = list(result.token_ids)
            body["prompt_token_ids"] = run.ids
        return json_response(body)

    async def _stream(self, request: web.Request, run: _Generation) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            async with aclosing(run.steps()) as steps:
                async for step in steps:
                    await response.write(sse(run.chunk(step)))
                    if step.result is not None and run.req.include_usage:
                        await response.write(
                            sse(usage_chunk(run.cid, run.model, run.usage(step.result)))
                        )
            await response.write(DONE)
        except ApiError as exc:
            await response.write(sse(exc.body()))
            await response.write(DONE)
        except ConnectionResetError:
            log.info("client went away during a stream; generation stopped")
            return response
        await response.write_eof()
        return response


class _Generation:
    """One completion in flight: runs in the engine thread, steps come back through a queue."""

    def __init__(
        self,
        state: ServiceState,
        runtime: WorkerRuntime,
        ids: list[int],
        req: CompletionRequest,
        arrived: float, spans: tuple[ChunkSpan, ...] = (),
    ) -> None:
        self.state, self.runtime, self.ids, self.req, self.spans = state, runtime, ids, req, spans
        self.arrived = arrived
        self.first = 0.0
        self.cid = completion_id()
        self.model = runtime.engine.model_id
        self.created = int(time.time())

    def usage(self, r: GenerationResult) -> dict:
        return usage(r.prompt_tokens, len(r.token_ids), r.cached_tokens,
                     (self.first - self.arrived) * 1000, r.blended_tokens, r.approx_cached_tokens)

    def chunk(self, step: GenerationStep) -> dict:
        finish = step.result.finish_reason if step.result is not None else None
        body = completion_body(self.cid, self.model, step.text, finish, None, self.created)
        if self.req.return_token_ids:
            stopped = step.result is not None and step.result.finish_reason == "stop"
            body["choices"][0]["token_ids"] = [] if stopped else [step.token_id]
        return body

    async def steps(self) -> AsyncGenerator[GenerationStep, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[GenerationStep | BaseException | None] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(step: GenerationStep) -> bool:
            if cancelled.is_set():
                return False
            if not self.first:
                self.first = time.perf_counter()
            loop.call_soon_threadsafe(queue.put_nowait, step)
            return True

        job = partial(
            self.runtime.generate,
            self.ids,
            tenant=self.req.tenant,
            max_tokens=self.req.max_tokens,
            temperature=self.req.temperature,
            arrived=self.arrived,
            emit=emit,
            chunk_refs=chunk_keys(self.req.chunk_refs),
            chunks=self.spans, chunk_reuse=self.req.chunk_reuse,
        )
        future = loop.run_in_executor(self.state.executor, job)
        future.add_done_callback(lambda f: queue.put_nowait(_outcome(f)))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise ApiError(500, f"generation failed: {item}", kind="server_error")
                yield item
                if item.result is not None:
                    return
            raise ApiError(500, "generation ended without a result", kind="server_error")
        finally:
            cancelled.set()


def _outcome(future: asyncio.Future) -> BaseException | None:
    """None when the job ended normally; an error is logged (it may follow the answer)."""
    if future.cancelled():
        return asyncio.CancelledError()
    exc = future.exception()
    if exc is not None:
        log.error("generation failed", exc_info=exc)
    return exc


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8") from None


# -- application and lifecycle -------------------------------------------------------


def build_app(state: ServiceState) -> web.Application:
    """The aiohttp application; boot starts in the background when the app starts."""
    middlewares: list[Any] = [errors]
    ring = state.config.keyring or KeyRing(state.config.api_key)
    if ring.enabled:
        middlewares.append(key_auth(ring))
    app = web.Application(middlewares=middlewares, client_max_size=state.config.max_body_bytes)
    app[STATE] = state
    h = Handlers(state)
    app.add_routes(
        [
            web.get("/health/live", h.live),
            web.get("/health/ready", h.ready),
            web.get("/metrics", h.metrics),
            web.get("/v1/models", h.models),
            web.get("/v1/cache", h.cache),
            web.post("/v1/completions", h.completions),
            web.post("/v1/prefill", h.prefill),
        ]
    )
    app.on_startup.append(partial(_on_startup, state))
    app.on_shutdown.append(partial(_on_shutdown, state))
    return app


async def _on_startup(state: ServiceState, app: web.Application) -> None:
    state.tasks.append(asyncio.create_task(_boot(state)))


async def _boot(state: ServiceState) -> None:
    loop = asyncio.get_running_loop()

    def report(reason: str) -> None:
        log.info("boot: %s", reason)
        state.reason = reason

    try:
        state.runtime = await loop.run_in_executor(state.executor, state.lifecycle.start, report)
    except BrokerUnavailable as exc:
        log.error("worker failed to start: %s", exc)
        state.reason, state.failed = f"start failed: {exc}", True
        state.stopping.set()
        return
    except Exception as exc:
        log.exception("worker failed to start")
        state.reason, state.failed = f"start failed: {exc}", True
        state.stopping.set()
        return
    # Announce first, then open the probe: once /health/ready says 200 the fleet has been told,
    # so anything that waits on the probe can count on the streams app warming this worker.
    try:
        await loop.run_in_executor(state.executor, _send_status, state.runtime, "ready")
    except Exception:
        log.exception("could not announce ready; heartbeats will still list this worker")
    state.ready, state.reason = True, "ready"
    state.metrics.set_ready(True)
    log.info("worker %s ready at %s", state.config.worker_id, state.runtime.url)
    state.tasks.append(asyncio.create_task(_heartbeats(state, state.runtime)))


def _send_status(runtime: WorkerRuntime, kind: Literal["ready", "heartbeat", "stopped"]) -> None:
    runtime.flush()
    runtime.send(runtime.status_event(kind))


async def _heartbeats(state: ServiceState, runtime: WorkerRuntime) -> None:
    """Expire and heartbeat on the heartbeat thread; `tick` skips expiry while the engine
    is busy, so a heartbeat never waits for a generation."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(state.config.heartbeat_s)
        try:
            await loop.run_in_executor(state.heartbeat_executor, runtime.tick)
            await loop.run_in_executor(state.heartbeat_executor, _send_status, runtime, "heartbeat")
        except Exception:
            log.exception("heartbeat failed; the next one is in %.0f s", state.config.heartbeat_s)


async def _on_shutdown(state: ServiceState, app: web.Application) -> None:
    was_ready = state.ready
    state.ready, state.reason = False, "stopping"
    state.metrics.set_ready(False)
    for task in state.tasks:
        task.cancel()
    await asyncio.gather(*state.tasks, return_exceptions=True)
    loop = asyncio.get_running_loop()
    if was_ready and state.runtime is not None:
        await loop.run_in_executor(state.executor, _send_status, state.runtime, "stopped")
    await loop.run_in_executor(state.executor, state.lifecycle.stop)
    state.executor.shutdown(wait=False, cancel_futures=True)
    state.heartbeat_executor.shutdown(wait=False, cancel_futures=True)


async def serve(state: ServiceState, host: str, port: int) -> int:
    """Run the app until SIGTERM/SIGINT or a failed boot; the process exit status."""
    import signal

    runner = web.AppRunner(build_app(state), handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("listening on http://%s:%d", host, port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, state.stopping.set)
    await state.stopping.wait()
    await runner.cleanup()
    return 1 if state.failed else 0
