"""`AsyncRagClient`: the asyncio twin of `RagClient` (retrieve, route, stream, fail over, log)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import httpx

from rag.prompt import PromptBuilder
from rag.settings import QdrantSettings, RagSettings
from ragwarm.client.contract import check_prompt
from ragwarm.client.fallback import (
    ROUTED,
    InFlight,
    WorkerTable,
    fallback_route,
    retrieval_backend,
    retrieval_unavailable,
)
from ragwarm.client.rag import (
    Answer,
    PreparedQuery,
    QdrantRetrieval,
    QueryEmitter,
    auth_headers,
    build_answer,
    completion_body,
    prompt_params,
    query_event,
    streams_body,
)
from ragwarm.client.settings import ClientSettings
from ragwarm.client.wire import (
    UP_HINT,
    ClientError,
    Failover,
    RetrievedChunk,
    Route,
    StreamResult,
    StreamsUnavailable,
    WorkerFailed,
    WorkerRef,
    error_message,
    sse_data,
    status_error,
    workers_to_try,
)
from ragwarm.settings import KafkaSettings, ModelSettings
from schemas.prefix import BLOCK_SIZE, prompt_chain

log = logging.getLogger(__name__)

AsyncOnToken = Callable[[str], Awaitable[None]]


class PartialAnswerLost(ClientError):
    """A worker failed after part of the answer was handed out; it cannot be taken back."""


class AsyncRagClient:
    """Answers questions through the warm worker; many queries may run at once.

    Same contracts as `RagClient`: the canonical prompt, routing by the streams app, trying
    the next worker when one fails, and one QueryEvent per answer. With `restart_on_retry`
    false (the gateway streaming to an app), a worker that fails after the first token ends
    the answer with `PartialAnswerLost` instead of starting it again elsewhere.
    """

    def __init__(self, settings: ClientSettings, prompts: PromptBuilder, model_salt: str,
                 streams: httpx.AsyncClient, retrieval: QdrantRetrieval | None = None,
                 emitter: QueryEmitter | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 block_size: int = BLOCK_SIZE, top_k: int = 3):
        self.settings = settings
        self.prompts = prompts
        self.model_salt = model_salt
        self.streams = streams
        self.retrieval = retrieval  # None: retrieve through the streams app
        self.emitter = emitter
        self.block_size = block_size
        self.top_k = top_k  # must equal the streams app's RAGWARM_RAG_TOP_K
        self._transport = transport
        self._pools: dict[str, httpx.AsyncClient] = {}
        self.table = WorkerTable()  # workers last learned, to route by when the app is down
        self.in_flight = InFlight()  # the gateway's concurrent queries: the load it sees

    @classmethod
    async def open(cls, settings: ClientSettings | None = None,
                   kafka: KafkaSettings | None = None,
                   models: ModelSettings | None = None,
                   rag: RagSettings | None = None) -> AsyncRagClient:
        """A client with its tokenizer, warmed pools and (unless disabled) its Kafka producer;
        PromptMismatch when the streams app builds canonical prompts otherwise."""
        from ragwarm.models import llm_dir, load_tokenizer

        settings = settings or ClientSettings()
        models = models or ModelSettings()
        rag = rag or RagSettings()
        async with AsyncExitStack() as undo:
            streams = make_async_pool(settings, settings.streams_url,
                                      headers=auth_headers(settings))
            undo.push_async_callback(streams.aclose)
            health = await check_streams(streams, settings.streams_url)
            check_prompt(health, prompt_params(rag, models), settings.streams_url)
            tokenizer = await asyncio.to_thread(load_tokenizer, llm_dir(models=models))
            retrieval = emitter = None
            if retrieval_backend(settings.retrieval, QdrantSettings().url) == "qdrant":
                retrieval = await asyncio.to_thread(QdrantRetrieval.open, models)
                undo.callback(retrieval.close)
            if settings.emit_queries:
                emitter = await asyncio.to_thread(QueryEmitter.open, kafka or KafkaSettings())
                undo.callback(emitter.close)
            client = cls(settings, PromptBuilder(tokenizer, rag.system_prompt), models.llm_name,
                         streams, retrieval, emitter, top_k=rag.top_k)
            await client.warm_pools()
            undo.pop_all()
        return client

    # -- pools ----------------------------------------------------------------------------
    async def warm_pools(self) -> list[str]:
        """Open a keep-alive connection to every ready worker the streams app knows."""
        try:
            rows = (await self._streams_json("GET", "/ragwarm/workers")).get("workers") or []
        except ClientError as exc:
            if "403" not in str(exc):
                raise
            return []  # a tenant key may not list workers: pools then open on first use
        warmed = []
        for row in rows:
            if row.get("url") and row.get("ready"):
                try:
                    await self._pool(row["url"]).get("/health/live")
                    warmed.append(WorkerRef(str(row["worker_id"]), str(row["url"])))
                except httpx.HTTPError as exc:
                    log.info("worker %s not reachable yet: %s", row.get("worker_id"), exc)
        self.table.learn(warmed, time.monotonic())
        return [w.worker_id for w in warmed]

    def _pool(self, url: str) -> httpx.AsyncClient:
        pool = self._pools.get(url)
        if pool is None:
            pool = self._pools[url] = make_async_pool(self.settings, url, self._transport,
                                                      auth_headers(self.settings))
        return pool

    # -- the query path -------------------------------------------------------------------
    async def prepare(self, question: str, tenant: str | None = None) -> PreparedQuery:
        """Retrieve the top-k chunks and build the canonical prompt with its block hashes."""
        tenant = tenant or self.settings.tenant
        started = time.perf_counter()
        chunks = tuple(await self._retrieve(question, tenant))
        retrieve_ms = (time.perf_counter() - started) * 1000
        prompt = await asyncio.to_thread(self.prompts.build, chunks, question)
        chain = prompt_chain(prompt.token_ids, prompt.prefix_len, tenant=tenant,
                             model=self.model_salt, block_size=self.block_size)
        return PreparedQuery(question, tenant, chunks, prompt, chain, retrieve_ms)

    async def _retrieve(self, question: str, tenant: str) -> list[RetrievedChunk]:
        if self.retrieval is not None:
            return await asyncio.to_thread(self.retrieval.retrieve, question, tenant, self.top_k)
        try:
            body = await self._streams_json("POST", "/ragwarm/retrieve", {
                "question": question, "tenant": tenant, "k": self.top_k})
        except StreamsUnavailable as exc:
            raise retrieval_unavailable(exc) from None
        return [RetrievedChunk.from_json(c) for c in body.get("chunks") or ()]

    async def route(self, prepared: PreparedQuery) -> Route:
        """Ask the streams app which worker holds the longest prefix of this prompt (and
        learn its list of ready workers, to route by if the app goes away)."""
        route = Route.from_json(await self._streams_json(
            "POST", "/ragwarm/route", {"block_hashes": list(prepared.block_hashes)}))
        self.table.learn(route.workers, time.monotonic())
        return route

    async def _route(self, prepared: PreparedQuery) -> tuple[Route, str]:
        """The streams app's route, or, while it does not answer, one by load."""
        try:
            return await self.route(prepared), ROUTED
        except StreamsUnavailable as exc:
            log.warning("routing by load without the streams app: %s", exc)
            return fallback_route(self.table, self.in_flight, time.monotonic(),
                                  self.settings.worker_table_max_age_s, exc)

    async def query(self, question: str, tenant: str | None = None,
                    max_tokens: int | None = None, on_token: AsyncOnToken | None = None,
                    restart_on_retry: bool = True) -> Answer:
        """Answer one question; `on_token` gets the text as it streams."""
        started = time.perf_counter()
        prepared = await self.prepare(question, tenant)
        return await self.ask(prepared, max_tokens, on_token, started,
                              restart_on_retry=restart_on_retry)

    async def ask(self, prepared: PreparedQuery, max_tokens: int | None = None,
                  on_token: AsyncOnToken | None = None, started: float | None = None,
                  temperature: float | None = None, restart_on_retry: bool = True) -> Answer:
        """Route and stream an already prepared query, then emit its QueryEvent."""
        started = started if started is not None else time.perf_counter()
        routed_at = time.perf_counter()
        route, routing = await self._route(prepared)
        route_ms = (time.perf_counter() - routed_at) * 1000
        workers = workers_to_try(route, self.settings.max_attempts, self.settings.streams_url)
        temperature = self.settings.temperature if temperature is None else temperature
        body = completion_body(prepared, max_tokens or self.settings.max_tokens, temperature)
        worker, result, failed = await self._first_success(workers, body, on_token,
                                                           restart_on_retry)
        answer = build_answer(prepared, worker, result, failed, started, route_ms,
                              route.matched_blocks if worker == route.chosen else 0, routing)
        if self.emitter is not None:
            self.emitter.emit(query_event(prepared, answer))
        return answer

    async def _first_success(self, workers: Sequence[WorkerRef], body: dict,
                             on_token: AsyncOnToken | None, restart_on_retry: bool,
                             ) -> tuple[WorkerRef, StreamResult, list[str]]:
        failover = Failover()
        for worker in workers:
            result = StreamResult(sent_at=time.perf_counter())
            try:
                return worker, await self._stream(worker, body, on_token, result), failover.failed
            except WorkerFailed as exc:
                if result.text and not restart_on_retry:
                    raise PartialAnswerLost(f"worker {worker.worker_id} failed after part of "
                                            f"the answer was sent: {exc}") from None
                failover.worker_failed(worker, exc)
        raise failover.exhausted()

    async def _stream(self, worker: WorkerRef, body: dict, on_token: AsyncOnToken | None,
                      result: StreamResult) -> StreamResult:
        self.in_flight.start(worker.worker_id)
        try:
            async with self._pool(worker.url).stream("POST", "/v1/completions",
                                                     json=body) as response:
                await _check_status(worker, response)
                async for data in _async_sse(response):
                    text = result.feed(data, time.perf_counter())
                    if text and on_token is not None:
                        await on_token(text)
                    if result.done:
                        break
        except httpx.TransportError as exc:
            raise WorkerFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            self.in_flight.end(worker.worker_id)
        result.check_complete()
        return result

    async def _streams_json(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            response = await self.streams.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise StreamsUnavailable(f"the streams app does not answer at "
                                     f"{self.settings.streams_url} ({exc}); {UP_HINT}") from None
        return streams_body(path, response)

    # -- lifecycle ------------------------------------------------------------------------
    async def aclose(self) -> None:
        if self.emitter is not None:
            await asyncio.to_thread(self.emitter.close)
        if self.retrieval is not None:
            self.retrieval.close()
        for pool in self._pools.values():
            await pool.aclose()
        await self.streams.aclose()

    async def __aenter__(self) -> AsyncRagClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()


def make_async_pool(settings: ClientSettings, url: str,
                    transport: httpx.AsyncBaseTransport | None = None,
                    headers: Mapping[str, str] | None = None) -> httpx.AsyncClient:
    """A keep-alive async pool to one server with the client's limits and timeouts."""
    limits = httpx.Limits(max_keepalive_connections=settings.pool_connections,
                          max_connections=settings.pool_max, keepalive_expiry=settings.keepalive_s)
    timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
    return httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout, transport=transport,
                             headers=dict(headers or {}))


async def check_streams(streams: httpx.AsyncClient, url: str) -> dict:
    """The streams app's health view; StreamsUnavailable, with the fix, if it does not answer."""
    try:
        response = await streams.get("/ragwarm/health")
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise StreamsUnavailable(f"the streams app does not answer at {url} ({exc}); "
                                 f"{UP_HINT}") from None


async def _async_sse(response: httpx.Response) -> Any:
    """The data of each complete server-sent event of an async response."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        lines.append(line)
        if not line:  # an event ends at its blank line: parse what has gathered
            for data in sse_data(lines):
                yield data
            lines = []


async def _check_status(worker: WorkerRef, response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    await response.aread()
    try:
        message = error_message(response.json())
    except ValueError:
        message = response.text[:300]
    error = status_error(worker, response.status_code, message)
    if error is not None:
        raise error
