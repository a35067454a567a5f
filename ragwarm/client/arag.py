"""`AsyncRagClient`: the asyncio shell over httpx of the client core, the sync `RagClient`'s
twin (retrieve, route, stream, fail over, log); the steps are in `core`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import httpx

from rag.prompt import PromptBuilder
from rag.settings import RagSettings
from ragwarm.client import fallback
from ragwarm.client.core import (
    COMPLETIONS,
    HEALTH,
    RETRIEVE,
    ROUTE,
    WORKERS,
    Answer,
    ClientConfig,
    ClientCore,
    PartialAnswerLost,
    PreparedQuery,
    attempt_failed,
    health_body,
    opened_health,
    pool_options,
    prepared_query,
    retrieve_body,
    retrieved_chunks,
    route_body,
    streams_body,
    streams_down,
    worker_error,
    workers_to_warm,
)
from ragwarm.client.emitter import QueryEmitter
from ragwarm.client.retrieval import QdrantRetrieval, RetrievalBackend
from ragwarm.client.settings import ClientSettings
from ragwarm.client.wire import (
    Failover,
    RetrievedChunk,
    Route,
    StreamResult,
    StreamsUnavailable,
    WorkerFailed,
    WorkerRef,
    sse_data,
)
from ragwarm.settings import KafkaSettings, ModelSettings

__all__ = ["AsyncRagClient", "PartialAnswerLost"]

log = logging.getLogger(__name__)

AsyncOnToken = Callable[[str], Awaitable[None]]


class AsyncRagClient(ClientCore[httpx.AsyncClient]):
    """Answers questions through the warm worker; many queries may run at once.

    Same contracts as `RagClient` (the same core): the canonical prompt, routing by the
    streams app, trying the next worker when one fails, and one QueryEvent per answer. With
    `restart_on_retry` false (the gateway streaming to an app), a worker that fails after
    the first token ends the answer with `PartialAnswerLost` instead of starting it again
    elsewhere.
    """

    def __init__(self, config: ClientConfig, prompts: PromptBuilder,
                 streams: httpx.AsyncClient, retrieval: RetrievalBackend | None = None,
                 emitter: QueryEmitter | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(config, prompts, retrieval, emitter, lambda url: make_async_pool(
            config.settings, url, transport, config.headers))
        self.streams = streams

    @classmethod
    async def open(cls, settings: ClientSettings | None = None,
                   kafka: KafkaSettings | None = None,
                   models: ModelSettings | None = None,
                   rag: RagSettings | None = None, *,
                   streams_optional: bool = False) -> AsyncRagClient:
        """A client with its tokenizer, warmed pools and (unless disabled) its Kafka producer;
        PromptMismatch when the streams app builds canonical prompts otherwise.
        `streams_optional`: open even while the app does not answer (a client that routes
        and retrieves by its own view, the gateway's); the check then waits for it."""
        from ragwarm.models import llm_dir, load_tokenizer

        config = ClientConfig.resolve(settings, kafka, models, rag)
        url = config.settings.streams_url
        async with AsyncExitStack() as undo:
            streams = make_async_pool(config.settings, url, headers=config.headers)
            undo.push_async_callback(streams.aclose)
            found: dict | StreamsUnavailable
            try:
                found = await check_streams(streams, url)
            except StreamsUnavailable as exc:
                found = exc
            down = opened_health(found, config.params, url, optional=streams_optional)
            tokenizer = await asyncio.to_thread(load_tokenizer, llm_dir(models=config.models))
            retrieval = emitter = None
            if config.retrieval == "qdrant":
                retrieval = await asyncio.to_thread(QdrantRetrieval.open,
                                                    config.models or ModelSettings())
                undo.callback(retrieval.close)
            if config.kafka is not None:
                emitter = await asyncio.to_thread(QueryEmitter.open, config.kafka)
                undo.callback(emitter.close)
            client = cls(config, PromptBuilder(tokenizer, config.system_prompt), streams,
                         retrieval, emitter)
            if down is not None:
                client.opened_without_streams(down)
            else:
                await client.warm_pools()
            undo.pop_all()
        return client

    # -- pools ----------------------------------------------------------------------------
    async def _reachable(self, worker: WorkerRef) -> bool:
        """Open the pool to a listed worker; False (logged) where it does not answer yet."""
        try:
            await self.pool(worker.url).get("/health/live")
        except httpx.HTTPError as exc:
            log.info("worker %s at %s not reachable yet: %s", worker.worker_id, worker.url, exc)
            return False
        return True

    async def warm_pools(self) -> list[str]:
        """Open a keep-alive connection to the streams app and to every ready worker."""
        await check_streams(self.streams, self.settings.streams_url)
        to_warm = workers_to_warm(await self._streams_call("GET", WORKERS))
        if to_warm is None:
            return []  # a tenant key may not list workers: pools then open on first use
        return self.learn([worker for worker in to_warm if await self._reachable(worker)])

    # -- the query path -------------------------------------------------------------------
    async def prepare(self, question: str, tenant: str | None = None) -> PreparedQuery:
        """Retrieve the top-k chunks and build the canonical prompt with its block hashes."""
        tenant = tenant or self.settings.tenant
        started = time.perf_counter()
        chunks = tuple(await self._retrieve(question, tenant))
        retrieve_ms = (time.perf_counter() - started) * 1000
        prompt = await asyncio.to_thread(self.prompts.build, chunks, question)
        return prepared_query(self.config, question, tenant, chunks, prompt, retrieve_ms)

    async def _retrieve(self, question: str, tenant: str) -> list[RetrievedChunk]:
        if self.retrieval is not None:
            return await asyncio.to_thread(self.retrieval.retrieve, question, tenant, self.top_k)
        try:
            body = await self._streams_json("POST", RETRIEVE,
                                            retrieve_body(question, tenant, self.top_k))
        except StreamsUnavailable as exc:
            raise fallback.retrieval_unavailable(exc) from None
        return retrieved_chunks(body)

    async def route(self, prepared: PreparedQuery) -> Route:
        """Ask the streams app which worker holds the longest prefix of this prompt (and
        learn its list of ready workers, to route by if the app goes away)."""
        return self.routed(await self._streams_json("POST", ROUTE, route_body(prepared)))

    async def _route(self, prepared: PreparedQuery) -> tuple[Route, str]:
        """The streams app's route, or, while it does not answer, one by load."""
        try:
            return await self.route(prepared), fallback.ROUTED
        except StreamsUnavailable as exc:
            return self.route_by_load(exc)

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
        body = self.body(prepared, max_tokens, temperature)
        worker, result, failed = await self._first_success(self.workers_for(route), body,
                                                           on_token, restart_on_retry)
        return self.answered(prepared, route, routing, worker, result, failed, started,
                             route_ms)

    async def _first_success(self, workers: Sequence[WorkerRef], body: dict,
                             on_token: AsyncOnToken | None, restart_on_retry: bool,
                             ) -> tuple[WorkerRef, StreamResult, list[str]]:
        failover = Failover()
        for worker in workers:
            result = StreamResult(sent_at=time.perf_counter())
            try:
                return worker, await self._stream(worker, body, on_token, result), failover.failed
            except WorkerFailed as exc:
                attempt_failed(failover, worker, exc, result, restart_on_retry)
        raise failover.exhausted()

    async def _stream(self, worker: WorkerRef, body: dict, on_token: AsyncOnToken | None,
                      result: StreamResult) -> StreamResult:
        with self.attempt(worker, result):
            async with self.pool(worker.url).stream("POST", COMPLETIONS,
                                                     json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise worker_error(worker, response)
                async for data in _async_sse(response):
                    text = result.feed(data, time.perf_counter())
                    if text and on_token is not None:
                        await on_token(text)
                    if result.done:
                        break
        return result

    async def _streams_call(self, method: str, path: str,
                            body: dict | None = None) -> httpx.Response:
        if self.contract_pending:  # opened while the app was down: check it first
            self.contract_checked(await check_streams(self.streams, self.settings.streams_url))
        try:
            return await self.streams.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise streams_down(self.settings.streams_url, exc) from None

    async def _streams_json(self, method: str, path: str, body: dict | None = None) -> dict:
        return streams_body(path, await self._streams_call(method, path, body))

    # -- lifecycle ------------------------------------------------------------------------
    async def aclose(self) -> None:
        if self.emitter is not None:
            await asyncio.to_thread(self.emitter.close)
        if self.retrieval is not None:
            self.retrieval.close()
        for pool in self.pools.values():
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
    return httpx.AsyncClient(base_url=url, transport=transport, headers=dict(headers or {}),
                             **pool_options(settings))


async def check_streams(streams: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The streams app's health view; StreamsUnavailable, with the fix, if it does not answer."""
    try:
        response = await streams.get(HEALTH)
    except httpx.HTTPError as exc:
        raise streams_down(url, exc) from None
    return health_body(response, url)


async def _async_sse(response: httpx.Response) -> AsyncIterator[str]:
    """The data of each complete server-sent event of an async response."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        lines.append(line)
        if not line:  # an event ends at its blank line: parse what has gathered
            for data in sse_data(lines):
                yield data
            lines = []
