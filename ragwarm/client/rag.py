"""`RagClient`: retrieve, canonical prompt, route to a warm worker, stream, log the query."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, Protocol

import httpx

from rag.prompt import Prompt, PromptBuilder
from rag.settings import QdrantSettings, RagSettings
from ragwarm.client import fallback
from ragwarm.client.contract import check_prompt
from ragwarm.client.emitter import QueryEmitter
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
from ragwarm.settings import KafkaSettings, ModelSettings, qdrant_settings
from schemas import ChunkRef, QueryEvent
from schemas.prefix import BLOCK_SIZE, PromptChain, PromptParams, prompt_chain

log = logging.getLogger(__name__)

OnToken = Callable[[str], None]


# --- results -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedQuery:
    """A question with its retrieved chunks, canonical prompt and block-chain hashes."""

    question: str
    tenant: str
    chunks: tuple[RetrievedChunk, ...]
    prompt: Prompt
    chain: PromptChain
    retrieve_ms: float

    @property
    def block_hashes(self) -> tuple[str, ...]:
        return self.chain.hashes

    @property
    def prefix_hashes(self) -> tuple[str, ...]:
        return self.chain.prefix_hashes

    @property
    def prefix_hash(self) -> str | None:
        return self.chain.prefix_hash


@dataclass(frozen=True)
class Answer:
    """One answered query with where it ran and how fast the first token came."""

    question: str
    tenant: str
    qid: str
    text: str
    worker_id: str
    ttft_ms: float  # client-side: completion request sent -> first token received
    worker_ttft_ms: float | None  # the worker's own figure (request arrival -> first token)
    e2e_ttft_ms: float  # from the start of `query` (retrieval and routing included)
    total_ms: float
    retrieve_ms: float
    route_ms: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prefix_tokens: int
    prefix_hash: str | None
    matched_blocks: int
    chunk_refs: tuple[ChunkRef, ...]
    doc_ids: tuple[str, ...]
    finish_reason: str | None
    failed_workers: tuple[str, ...] = ()
    blended_tokens: int = 0  # prompt tokens the worker placed from held chunk KV
    routing: str = fallback.ROUTED  # who chose the worker: the streams app, or a fallback by load

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["chunk_refs"] = [r.model_dump() for r in self.chunk_refs]
        return body


# --- retrieval backends ----------------------------------------------------------------
class RetrievalBackend(Protocol):
    """Where the client gets a question's top-k chunks (not `rag.retrieve.Retrieval`, the
    result of one search)."""

    def retrieve(self, question: str, tenant: str, k: int) -> list[RetrievedChunk]: ...

    def close(self) -> None: ...


class StreamsRetrieval:
    """Retrieval through the streams app, which owns the embedded Qdrant store."""

    def __init__(self, streams: httpx.Client) -> None:
        self.streams = streams

    def retrieve(self, question: str, tenant: str, k: int) -> list[RetrievedChunk]:
        try:
            body = _post_json(self.streams, "/ragwarm/retrieve",
                              {"question": question, "tenant": tenant, "k": k})
        except StreamsUnavailable as exc:
            raise fallback.retrieval_unavailable(exc) from None
        return [RetrievedChunk.from_json(c) for c in body.get("chunks") or ()]

    def close(self) -> None:
        """The streams pool belongs to the client."""


class QdrantRetrieval:
    """Retrieval straight from a Qdrant server (its HTTP pool opens with the store)."""

    def __init__(self, retriever: Any) -> None:
        self.retriever = retriever

    @classmethod
    def open(cls, models: ModelSettings) -> QdrantRetrieval:
        from rag.retrieve import Retriever
        from rag.settings import RagSettings
        from rag.store import ChunkStore
        from ragwarm.models import load_embedder

        rag = RagSettings()
        embedder = load_embedder(models, batch_size=rag.embed_batch_size)
        store = ChunkStore.open(qdrant_settings(), rag.collection, embedder.dim)
        return cls(Retriever(store, embedder, rag.top_k))

    def retrieve(self, question: str, tenant: str, k: int) -> list[RetrievedChunk]:
        hits = self.retriever.retrieve(question, tenant, k).hits
        return [RetrievedChunk(hit.chunk.chunk_id, hit.chunk.content_hash, hit.chunk.doc_id,
                               hit.chunk.text, hit.score, hit.version) for hit in hits]

    def close(self) -> None:
        self.retriever.store.close()


# --- the client --------------------------------------------------------------------------
class RagClient:
    """Answers questions through the warm worker; sync, one query at a time per instance.

    Pools to the streams app and to every known worker are opened and warmed at start (seed
    003: pre-established keep-alive connections), so a query pays no connection set-up. A
    worker that fails during a request (refused connection, 5xx, broken stream) is replaced
    by the next one the route named.
    """

    def __init__(self, settings: ClientSettings, prompts: PromptBuilder, model_salt: str,
                 streams: httpx.Client, retrieval: RetrievalBackend | None = None,
                 emitter: QueryEmitter | None = None,
                 transport: httpx.BaseTransport | None = None, block_size: int = BLOCK_SIZE,
                 top_k: int = 3):
        self.settings = settings
        # Must equal the streams app's RAGWARM_RAG_TOP_K, or warmed prefixes never match.
        self.top_k = top_k
        self.prompts = prompts
        self.model_salt = model_salt
        self.streams = streams
        self.retrieval = retrieval or StreamsRetrieval(streams)
        self.emitter = emitter
        self.block_size = block_size
        self._transport = transport
        self._pools: dict[str, httpx.Client] = {}
        self.table = fallback.WorkerTable()  # the workers to route by while the app is down
        self.in_flight = fallback.InFlight()

    @classmethod
    def open(cls, settings: ClientSettings | None = None, kafka: KafkaSettings | None = None,
             models: ModelSettings | None = None, rag: RagSettings | None = None) -> RagClient:
        """A client with its tokenizer, warmed pools and (unless disabled) its Kafka producer.

        Raises PromptMismatch, naming the setting, when the streams app builds canonical
        prompts with other parameters (top-k, system prompt, model, block size).
        """
        from ragwarm.models import llm_dir, load_tokenizer

        settings = settings or ClientSettings()
        models = models or ModelSettings()
        rag = rag or RagSettings()
        with ExitStack() as undo:  # closes what was opened if a later step fails
            streams = make_pool(settings, settings.streams_url, headers=auth_headers(settings))
            undo.callback(streams.close)
            # Fail fast, before the slow tokenizer load, when the stack is not up or differs.
            health = check_streams(streams, settings.streams_url)
            check_prompt(health, prompt_params(rag, models), settings.streams_url)
            prompts = PromptBuilder(load_tokenizer(llm_dir(models=models)), rag.system_prompt)
            retrieval = None
            if fallback.retrieval_backend(settings.retrieval, QdrantSettings().url) == "qdrant":
                retrieval = QdrantRetrieval.open(models)
                undo.callback(retrieval.close)
            emitter = None
            if settings.emit_queries:
                emitter = QueryEmitter.open(kafka or KafkaSettings())
                undo.callback(emitter.close)
            client = cls(settings, prompts, models.llm_name, streams, retrieval, emitter,
                         top_k=rag.top_k)
            client.warm_pools()
            undo.pop_all()
        return client

    # -- pools ----------------------------------------------------------------------------
    def warm_pools(self) -> list[str]:
        """Open a keep-alive connection to the streams app and to every known worker."""
        check_streams(self.streams, self.settings.streams_url)
        try:
            response = self.streams.get("/ragwarm/workers")
            if response.status_code == 403:
                return []  # a tenant key may not list workers: pools then open on first use
            rows = response.json().get("workers") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise StreamsUnavailable(f"/ragwarm/workers failed at {self.settings.streams_url}: "
                                     f"{exc}") from None
        warmed = []
        for row in rows:
            if row.get("url") and row.get("ready"):
                try:
                    self._pool(row["url"]).get("/health/live")
                    warmed.append(WorkerRef(str(row["worker_id"]), str(row["url"])))
                except httpx.HTTPError as exc:
                    log.info("worker %s at %s not reachable yet: %s", row.get("worker_id"),
                             row["url"], exc)
        self.table.learn(warmed, time.monotonic())
        return [w.worker_id for w in warmed]

    def _pool(self, url: str) -> httpx.Client:
        pool = self._pools.get(url)
        if pool is None:
            pool = self._pools[url] = make_pool(self.settings, url, self._transport,
                                                auth_headers(self.settings))
        return pool

    # -- the query path -------------------------------------------------------------------
    def prepare(self, question: str, tenant: str | None = None) -> PreparedQuery:
        """Retrieve the top-k chunks and build the canonical prompt with its block hashes."""
        tenant = tenant or self.settings.tenant
        started = time.perf_counter()
        chunks = tuple(self.retrieval.retrieve(question, tenant, self.top_k))
        retrieve_ms = (time.perf_counter() - started) * 1000
        prompt = self.prompts.build(chunks, question)
        chain = prompt_chain(prompt.token_ids, prompt.prefix_len, tenant=tenant,
                             model=self.model_salt, block_size=self.block_size)
        return PreparedQuery(question, tenant, chunks, prompt, chain, retrieve_ms)

    def route(self, prepared: PreparedQuery) -> Route:
        """Ask the streams app which worker holds the longest prefix of this prompt (and
        learn its list of ready workers, to route by if the app goes away)."""
        route = Route.from_json(_post_json(self.streams, "/ragwarm/route",
                                           {"block_hashes": list(prepared.block_hashes)}))
        self.table.learn(route.workers, time.monotonic())
        return route

    def _route(self, prepared: PreparedQuery) -> tuple[Route, str]:
        """The streams app's route, or, while it does not answer, one by load."""
        try:
            return self.route(prepared), fallback.ROUTED
        except StreamsUnavailable as exc:
            log.warning("routing by load without the streams app: %s", exc)
            return fallback.fallback_route(self.table, self.in_flight, time.monotonic(),
                                           self.settings.worker_table_max_age_s, exc)

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
        workers = workers_to_try(route, self.settings.max_attempts, self.settings.streams_url)
        body = self._completion_body(prepared, max_tokens, chunk_reuse)
        worker, result, failed = self._first_success(workers, body, on_token)
        answer = build_answer(prepared, worker, result, failed, started, route_ms,
                              route.matched_blocks if worker == route.chosen else 0, routing)
        if self.emitter is not None:
            self.emitter.emit(query_event(prepared, answer))
        return answer

    def ask_on(self, worker: WorkerRef, prepared: PreparedQuery,
               max_tokens: int | None = None) -> Answer:
        """Stream a prepared query on one given worker: no routing, no failover and no
        QueryEvent (a baseline measured beside the pipeline must not feed it)."""
        started = time.perf_counter()
        result = self._stream(worker, self._completion_body(prepared, max_tokens), None)
        return build_answer(prepared, worker, result, [], started, 0.0, 0)

    def _completion_body(self, prepared: PreparedQuery, max_tokens: int | None,
                         chunk_reuse: bool = True) -> dict:
        return completion_body(prepared, max_tokens or self.settings.max_tokens,
                               self.settings.temperature, chunk_reuse)

    def _first_success(self, workers: Sequence[WorkerRef], body: dict,
                       on_token: OnToken | None) -> tuple[WorkerRef, StreamResult, list[str]]:
        failover = Failover()
        for worker in workers:
            try:
                return worker, self._stream(worker, body, on_token), failover.failed
            except WorkerFailed as exc:
                failover.worker_failed(worker, exc)
        raise failover.exhausted()

    def _stream(self, worker: WorkerRef, body: dict, on_token: OnToken | None) -> StreamResult:
        pool = self._pool(worker.url)
        result = StreamResult(sent_at=time.perf_counter())
        self.in_flight.start(worker.worker_id)
        try:
            with pool.stream("POST", "/v1/completions", json=body) as response:
                _check_status(worker, response)
                for data in sse_data(response.iter_lines()):
                    text = result.feed(data, time.perf_counter())
                    if text and on_token is not None:
                        on_token(text)
                    if result.done:
                        break
        except httpx.TransportError as exc:
            raise WorkerFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            self.in_flight.end(worker.worker_id)
        result.check_complete()
        return result

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        if self.emitter is not None:
            self.emitter.close()
        self.retrieval.close()
        for pool in self._pools.values():
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
    limits = httpx.Limits(max_keepalive_connections=settings.pool_connections,
                          max_connections=settings.pool_max, keepalive_expiry=settings.keepalive_s)
    timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
    return httpx.Client(base_url=url, limits=limits, timeout=timeout, transport=transport,
                        headers=dict(headers or {}))


def auth_headers(settings: ClientSettings) -> dict[str, str]:
    """The bearer key for the workers and the streams views, if the client has one."""
    key = settings.api_key
    return {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}


def check_streams(streams: httpx.Client, url: str) -> dict:
    """The streams app's health view; StreamsUnavailable, with the fix, if it does not answer."""
    try:
        response = streams.get("/ragwarm/health")
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise StreamsUnavailable(f"the streams app does not answer at {url} ({exc}); "
                                 f"{UP_HINT}") from None


def prompt_params(rag: RagSettings, models: ModelSettings) -> PromptParams:
    """The canonical-prompt parameters a client with these settings builds prompts with."""
    return PromptParams.of(system_prompt=rag.system_prompt, top_k=rag.top_k,
                           model=models.llm_name, block_size=BLOCK_SIZE)


def _post_json(client: httpx.Client, path: str, body: dict) -> dict:
    try:
        response = client.post(path, json=body)
    except httpx.HTTPError as exc:
        raise StreamsUnavailable(f"the streams app does not answer at {client.base_url} "
                                 f"({exc}); {UP_HINT}") from None
    return streams_body(path, response)


def streams_body(path: str, response: httpx.Response) -> dict:
    """A streams view's JSON; a 5xx means the app cannot serve it now (StreamsUnavailable,
    which routing falls back from), any other refusal is the request's own (ClientError)."""
    if response.status_code >= 500:
        raise StreamsUnavailable(f"{path} answered {response.status_code}: "
                                 f"{response.text[:300]}")
    if response.status_code != 200:
        raise ClientError(f"{path} answered {response.status_code}: {response.text[:300]}")
    return response.json()


def _check_status(worker: WorkerRef, response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    response.read()
    try:
        message = error_message(response.json())
    except ValueError:
        message = response.text[:300]
    error = status_error(worker, response.status_code, message)
    if error is not None:
        raise error


def build_answer(prepared: PreparedQuery, worker: WorkerRef, result: StreamResult,
                 failed: list[str], started: float, route_ms: float, matched: int,
                 routing: str = fallback.ROUTED) -> Answer:
    usage = result.usage or {}
    first_at = result.first_at or result.sent_at
    details = usage.get("prompt_tokens_details") or {}
    worker_ttft = usage.get("ttft_ms")
    return Answer(
        question=prepared.question, tenant=prepared.tenant, qid=uuid.uuid4().hex,
        text=result.text, worker_id=worker.worker_id,
        ttft_ms=(first_at - result.sent_at) * 1000,
        worker_ttft_ms=float(worker_ttft) if worker_ttft is not None else None,
        e2e_ttft_ms=(first_at - started) * 1000,
        total_ms=(time.perf_counter() - started) * 1000,
        retrieve_ms=prepared.retrieve_ms, route_ms=route_ms,
        prompt_tokens=int(usage.get("prompt_tokens") or len(prepared.prompt.token_ids)),
        cached_tokens=int(details.get("cached_tokens") or 0),
        blended_tokens=int(details.get("blended_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prefix_tokens=prepared.prompt.prefix_len, prefix_hash=prepared.prefix_hash,
        matched_blocks=matched, chunk_refs=prepared.prompt.chunk_refs,
        doc_ids=tuple(dict.fromkeys(c.doc_id for c in prepared.chunks)),
        finish_reason=result.finish_reason, failed_workers=tuple(failed), routing=routing,
    )


def completion_body(prepared: PreparedQuery, max_tokens: int, temperature: float,
                    chunk_reuse: bool = True) -> dict:
    """The worker's streamed /v1/completions request for a prepared query (token ids), with
    where each chunk stands (a worker holding their chunk KV may blend it)."""
    prompt = prepared.prompt
    spans = [
        {"chunk_id": ref.chunk_id, "content_hash": ref.content_hash, "start": a, "end": b}
        for ref, (a, b) in zip(prompt.chunk_refs, prompt.chunk_spans, strict=True)
    ]
    return {
        "prompt": list(prepared.prompt.token_ids),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tenant": prepared.tenant,
        "chunk_refs": [r.model_dump() for r in prepared.prompt.chunk_refs],
        "chunk_spans": spans,
        "chunk_reuse": chunk_reuse,
    }


def query_event(prepared: PreparedQuery, answer: Answer) -> QueryEvent:
    """The rag.queries record of an answered query (block hashes of the prefix only)."""
    return QueryEvent(
        tenant=answer.tenant, question=answer.question[:8192], qid=answer.qid,
        chunk_refs=list(answer.chunk_refs), prefix_hash=prepared.prefix_hash,
        block_hashes=list(prepared.prefix_hashes), prefix_tokens=prepared.prompt.prefix_len,
        prompt_tokens=answer.prompt_tokens, cached_tokens=answer.cached_tokens,
        ttft_ms=answer.ttft_ms, worker_id=answer.worker_id,
    )
