"""`RagClient`: the sync shell over httpx of the client core (retrieve, canonical prompt,
route to a warm worker, stream, fail over, log the query); the steps are in `core`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
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
    PreparedQuery,
    attempt_failed,
    build_answer,
    completion_body,
    health_body,
    opened_health,
    pool_options,
    prepared_query,
    query_event,
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
    ClientError,
    Failover,
    Route,
    StreamResult,
    StreamsUnavailable,
    WorkerFailed,
    WorkerRef,
    sse_data,
)
from ragwarm.settings import KafkaSettings, ModelSettings

# Where callers found them before the core was split out.
__all__ = ["Answer", "ClientError", "PreparedQuery", "QdrantRetrieval", "RagClient",
           "completion_body", "query_event", "quiet_http_logs"]

log = logging.getLogger(__name__)

OnToken = Callable[[str], None]


class RagClient(ClientCore[httpx.Client]):
    """Answers questions through the warm worker; sync, one query at a time per instance.

    Pools to the streams app and to every known worker are opened and warmed at start (seed
    003: pre-established keep-alive connections), so a query pays no connection set-up. A
    worker that fails during a request (refused connection, 5xx, broken stream) is replaced
    by the next one the route named.
    """

    def __init__(self, config: ClientConfig, prompts: PromptBuilder, streams: httpx.Client,
                 retrieval: RetrievalBackend | None = None,
                 emitter: QueryEmitter | None = None,
                 transport: httpx.BaseTransport | None = None):
        super().__init__(config, prompts, retrieval, emitter,
                         lambda url: make_pool(config.settings, url, transport, config.headers))
        self.streams = streams

    @classmethod
    def open(cls, settings: ClientSettings | None = None, kafka: KafkaSettings | None = None,
             models: ModelSettings | None = None, rag: RagSettings | None = None, *,
             streams_optional: bool = False) -> RagClient:
        """A client with its tokenizer, warmed pools and (unless disabled) its Kafka producer.

        Raises PromptMismatch, naming the setting, when the streams app builds canonical
        prompts with other parameters (top-k, system prompt, model, block size).
        `streams_optional`: open even while the app does not answer (a client that routes
        and retrieves by its own view); the check then waits for it.
        """
        from ragwarm.models import llm_dir, load_tokenizer

        config = ClientConfig.resolve(settings, kafka, models, rag)
        url = config.settings.streams_url
        with ExitStack() as undo:  # closes what was opened if a later step fails
            streams = make_pool(config.settings, url, headers=config.headers)
            undo.callback(streams.close)
            found: dict | StreamsUnavailable
            try:
                found = check_streams(streams, url)
            except StreamsUnavailable as exc:
                found = exc
            down = opened_health(found, config.params, url, optional=streams_optional)
            prompts = PromptBuilder(load_tokenizer(llm_dir(models=config.models)),
                                    config.system_prompt)
            retrieval = emitter = None
            if config.retrieval == "qdrant":
                retrieval = QdrantRetrieval.open(config.models or ModelSettings())
                undo.callback(retrieval.close)
            if config.kafka is not None:
                emitter = QueryEmitter.open(config.kafka)
                undo.callback(emitter.close)
            client = cls(config, prompts, streams, retrieval, emitter)
            if down is not None:
                client.opened_without_streams(down)
            else:
                client.warm_pools()
            undo.pop_all()
        return client

    # -- pools ----------------------------------------------------------------------------
    def _reachable(self, worker: WorkerRef) -> bool:
        """Open the pool to a listed worker; False (logged) where it does not answer yet."""
        try:
            self.pool(worker.url).get("/health/live")
        except httpx.HTTPError as exc:
            log.info("worker %s at %s not reachable yet: %s", worker.worker_id, worker.url, exc)
            return False
        return True

    def warm_pools(self) -> list[str]:
        """Open a keep-alive connection to the streams app and to every ready worker."""
        check_streams(self.streams, self.settings.streams_url)
        to_warm = workers_to_warm(self._streams_call("GET", WORKERS))
        if to_warm is None:
            return []  # a tenant key may not list workers: pools then open on first use
        return self.learn([worker for worker in to_warm if self._reachable(worker)])

    # -- the query path -------------------------------------------------------------------
    def prepare(self, question: str, tenant: str | None = None) -> PreparedQuery:
        """Retrieve the top-k chunks and build the canonical prompt with its block hashes."""
        tenant = tenant or self.settings.tenant
        started = time.perf_counter()
        chunks = tuple(self._retrieve(question, tenant))
        retrieve_ms = (time.perf_counter() - started) * 1000
        prompt = self.prompts.build(chunks, question)
        return prepared_query(self.config, question, tenant, chunks, prompt, retrieve_ms)

    def _retrieve(self, question: str, tenant: str) -> list:
        if self.retrieval is not None:
            return self.retrieval.retrieve(question, tenant, self.top_k)
        try:
            body = self._streams_json("POST", RETRIEVE, retrieve_body(question, tenant,
                                                                      self.top_k))
        except StreamsUnavailable as exc:
            raise fallback.retrieval_unavailable(exc) from None
        return retrieved_chunks(body)

    def route(self, prepared: PreparedQuery) -> Route:
        """Ask the streams app which worker holds the longest prefix of this prompt (and
        learn its list of ready workers, to route by if the app goes away)."""
        return self.routed(self._streams_json("POST", ROUTE, route_body(prepared)))

    def _route(self, prepared: PreparedQuery) -> tuple[Route, str]:
        """The streams app's route, or, while it does not answer, one by load."""
        try:
            return self.route(prepared), fallback.ROUTED
        except StreamsUnavailable as exc:
            return self.route_by_load(exc)

    def query(self, question: str, tenant: str | None = None, max_tokens: int | None = None,
              on_token: OnToken | None = None, *, chunk_reuse: bool = True) -> Answer:
        """Answer one question. `on_token` gets the text as it streams (after a retry the
        answer starts again from its beginning). `chunk_reuse=False`: the worker computes
        the chunks after the exact prefix, never blending held chunk KV."""
        started = time.perf_counter()
        return self.ask(self.prepare(question, tenant), max_tokens, on_token, started,
                        chunk_reuse=chunk_reuse)

    def ask(self, prepared: PreparedQuery, max_tokens: int | None = None,
            on_token: OnToken | None = None, started: float | None = None, *,
            chunk_reuse: bool = True) -> Answer:
        """Route and stream an already prepared query, then emit its QueryEvent."""
        started = started if started is not None else time.perf_counter()
        routed_at = time.perf_counter()
        route, routing = self._route(prepared)
        route_ms = (time.perf_counter() - routed_at) * 1000
        body = self.body(prepared, max_tokens, chunk_reuse=chunk_reuse)
        worker, result, failed = self._first_success(self.workers_for(route), body, on_token)
        return self.answered(prepared, route, routing, worker, result, failed, started,
                             route_ms)

    def ask_on(self, worker: WorkerRef, prepared: PreparedQuery,
               max_tokens: int | None = None) -> Answer:
        """Stream a prepared query on one given worker: no routing, no failover and no
        QueryEvent (a baseline measured beside the pipeline must not feed it)."""
        started = time.perf_counter()
        result = StreamResult(sent_at=time.perf_counter())
        self._stream(worker, self.body(prepared, max_tokens), None, result)
        return build_answer(prepared, worker, result, [], started, 0.0, 0)

    def _first_success(self, workers: Sequence[WorkerRef], body: dict,
                       on_token: OnToken | None) -> tuple[WorkerRef, StreamResult, list[str]]:
        failover = Failover()
        for worker in workers:
            result = StreamResult(sent_at=time.perf_counter())
            try:
                return worker, self._stream(worker, body, on_token, result), failover.failed
            except WorkerFailed as exc:
                attempt_failed(failover, worker, exc, result, restart_on_retry=True)
        raise failover.exhausted()

    def _stream(self, worker: WorkerRef, body: dict, on_token: OnToken | None,
                result: StreamResult) -> StreamResult:
        pool = self.pool(worker.url)
        with self.attempt(worker, result), pool.stream("POST", COMPLETIONS,
                                                       json=body) as response:
            if response.status_code != 200:
                response.read()
                raise worker_error(worker, response)
            for data in sse_data(response.iter_lines()):
                text = result.feed(data, time.perf_counter())
                if text and on_token is not None:
                    on_token(text)
                if result.done:
                    break
        return result

    def _streams_call(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        if self.contract_pending:  # opened while the app was down: check it first
            self.contract_checked(check_streams(self.streams, self.settings.streams_url))
        try:
            return self.streams.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise streams_down(self.settings.streams_url, exc) from None

    def _streams_json(self, method: str, path: str, body: dict | None = None) -> dict:
        return streams_body(path, self._streams_call(method, path, body))

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        if self.emitter is not None:
            self.emitter.close()
        if self.retrieval is not None:
            self.retrieval.close()
        for pool in self.pools.values():
            pool.close()
        self.streams.close()

    def __enter__(self) -> RagClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def quiet_http_logs() -> None:
    """Keep httpx's per-request INFO lines out of command output unless at DEBUG."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("httpx").setLevel(logging.WARNING)


def make_pool(settings: ClientSettings, url: str, transport: httpx.BaseTransport | None = None,
              headers: Mapping[str, str] | None = None) -> httpx.Client:
    """A keep-alive pool to one server with the client's limits and timeouts."""
    return httpx.Client(base_url=url, transport=transport, headers=dict(headers or {}),
                        **pool_options(settings))


def check_streams(streams: httpx.Client, url: str) -> dict[str, Any]:
    """The streams app's health view; StreamsUnavailable, with the fix, if it does not answer."""
    try:
        response = streams.get(HEALTH)
    except httpx.HTTPError as exc:
        raise streams_down(url, exc) from None
    return health_body(response, url)
