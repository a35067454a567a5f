"""The RAG client's steps without I/O: its resolved configuration, the prepared query, the
requests it sends and how it reads the answers, the failover rule, the answer and its
QueryEvent. `RagClient` (sync) and `AsyncRagClient` (asyncio) are shells over httpx that
call these, so the two cannot drift apart (the sans-I/O style of h11 and wsproto)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Generic, Literal, TypeVar

import httpx

from rag.prompt import Prompt, PromptBuilder
from rag.settings import QdrantSettings, RagSettings
from ragwarm.client import fallback
from ragwarm.client.contract import check_prompt
from ragwarm.client.emitter import QueryEmitter
from ragwarm.client.retrieval import RetrievalBackend
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
    status_error,
    workers_to_try,
)
from ragwarm.settings import KafkaSettings, ModelSettings
from schemas import ChunkRef, QueryEvent
from schemas.prefix import BLOCK_SIZE, PromptChain, PromptParams, prompt_chain

log = logging.getLogger(__name__)

P = TypeVar("P")

HEALTH, WORKERS, RETRIEVE, ROUTE = ("/ragwarm/health", "/ragwarm/workers", "/ragwarm/retrieve",
                                    "/ragwarm/route")
COMPLETIONS = "/v1/completions"


# --- configuration -------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientConfig:
    """What a client runs with, resolved once in `open()` from the settings objects, so no
    step reads a setting of its own. `kafka` None: answered queries are not published."""

    settings: ClientSettings
    model_salt: str  # the LLM's name: salts the block hashes, names the tokenizer
    top_k: int = 3  # must equal the streams app's RAGWARM_RAG_TOP_K, or no prefix matches
    system_prompt: str = ""
    retrieval: Literal["streams", "qdrant"] = "streams"
    kafka: KafkaSettings | None = None
    models: ModelSettings | None = None  # where the tokenizer and embedder are; open() only
    block_size: int = BLOCK_SIZE

    @classmethod
    def resolve(cls, settings: ClientSettings | None = None, kafka: KafkaSettings | None = None,
                models: ModelSettings | None = None,
                rag: RagSettings | None = None) -> ClientConfig:
        """The configuration in effect: the given settings, the environment for the rest.
        Raises ValueError where the retrieval mode cannot work (`qdrant` without a URL)."""
        settings = settings or ClientSettings()
        models = models or ModelSettings()
        rag = rag or RagSettings()
        retrieval = fallback.retrieval_backend(settings.retrieval, QdrantSettings().url)
        emit_to = (kafka or KafkaSettings()) if settings.emit_queries else None
        return cls(settings, models.llm_name, rag.top_k, rag.system_prompt, retrieval, emit_to,
                   models)

    @property
    def params(self) -> PromptParams:
        """The canonical-prompt parameters this client builds prompts with."""
        return PromptParams.of(system_prompt=self.system_prompt, top_k=self.top_k,
                               model=self.model_salt, block_size=self.block_size)

    @property
    def headers(self) -> dict[str, str]:
        """The bearer key for the workers and the streams views, if the client has one."""
        key = self.settings.api_key
        return {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}


def pool_options(settings: ClientSettings) -> dict[str, Any]:
    """The keep-alive limits and timeouts of every pool a client opens (sync or async)."""
    return {
        "limits": httpx.Limits(max_keepalive_connections=settings.pool_connections,
                               max_connections=settings.pool_max,
                               keepalive_expiry=settings.keepalive_s),
        "timeout": httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
    }


# --- the prepared query ----------------------------------------------------------------------
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


def prepared_query(config: ClientConfig, question: str, tenant: str,
                   chunks: tuple[RetrievedChunk, ...], prompt: Prompt,
                   retrieve_ms: float) -> PreparedQuery:
    """The prepared query of a built prompt: its hash chain, salted by tenant and model."""
    chain = prompt_chain(prompt.token_ids, prompt.prefix_len, tenant=tenant,
                         model=config.model_salt, block_size=config.block_size)
    return PreparedQuery(question, tenant, chunks, prompt, chain, retrieve_ms)


# --- what is sent, and how the answers read -----------------------------------------------------
def retrieve_body(question: str, tenant: str, k: int) -> dict[str, Any]:
    return {"question": question, "tenant": tenant, "k": k}


def retrieved_chunks(body: Mapping[str, Any]) -> list[RetrievedChunk]:
    return [RetrievedChunk.from_json(c) for c in body.get("chunks") or ()]


def route_body(prepared: PreparedQuery) -> dict[str, Any]:
    return {"block_hashes": list(prepared.block_hashes)}


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


def streams_down(url: str, exc: Exception) -> StreamsUnavailable:
    """The streams app did not answer at all: say where, and how to start it."""
    return StreamsUnavailable(f"the streams app does not answer at {url} ({exc}); {UP_HINT}")


def opened_health(found: dict | StreamsUnavailable, params: PromptParams, url: str, *,
                  optional: bool) -> StreamsUnavailable | None:
    """What `open` makes of the streams app's health view (or the outage asking for it
    raised): the prompt check when it answered (PromptMismatch fails fast, before the slow
    tokenizer load); the outage itself when the client may open without the app; else it
    is raised."""
    if isinstance(found, StreamsUnavailable):
        if not optional:
            raise found
        return found
    check_prompt(found, params, url)
    return None


def health_body(response: httpx.Response, url: str) -> dict:
    """The streams app's health view; StreamsUnavailable, with the fix, if it is not one."""
    try:
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise streams_down(url, exc) from None


def streams_body(path: str, response: httpx.Response) -> dict:
    """A streams view's JSON; a 5xx means the app cannot serve it now (StreamsUnavailable,
    which routing falls back from), any other refusal is the request's own (ClientError)."""
    if response.status_code >= 500:
        raise StreamsUnavailable(f"{path} answered {response.status_code}: "
                                 f"{response.text[:300]}")
    if response.status_code != 200:
        raise ClientError(f"{path} answered {response.status_code}: {response.text[:300]}")
    try:
        return response.json()
    except ValueError as exc:
        raise StreamsUnavailable(f"{path} answered no JSON: {exc}") from None


def workers_to_warm(response: httpx.Response) -> list[WorkerRef] | None:
    """The ready workers /ragwarm/workers lists; None where the key may not list them (403:
    a tenant key), and the pools then open on first use."""
    if response.status_code == 403:
        return None
    rows = streams_body(WORKERS, response).get("workers") or ()
    return [WorkerRef(str(row["worker_id"]), str(row["url"]))
            for row in rows if row.get("url") and row.get("ready")]


def worker_error(worker: WorkerRef, response: httpx.Response) -> Exception:
    """How a worker's non-200 answer (its body already read) counts: WorkerFailed (another
    worker may answer) or RequestRejected (any would refuse)."""
    try:
        message = error_message(response.json())
    except ValueError:
        message = response.text[:300]
    # status_error is None only for a 200, which never comes here.
    return status_error(worker, response.status_code, message) or WorkerFailed(message)


# --- failover -----------------------------------------------------------------------------------
class PartialAnswerLost(ClientError):
    """A worker failed after part of the answer was handed out; it cannot be taken back."""


def attempt_failed(failover: Failover, worker: WorkerRef, exc: WorkerFailed,
                   result: StreamResult, restart_on_retry: bool) -> None:
    """Count a failed attempt, so the next worker is tried. Without `restart_on_retry` (an
    app already holds the first tokens) a failure after text went out ends the answer."""
    if result.text and not restart_on_retry:
        raise PartialAnswerLost(f"worker {worker.worker_id} failed after part of the answer "
                                f"was sent: {exc}") from None
    failover.worker_failed(worker, exc)


# --- the answer ---------------------------------------------------------------------------------
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
    approx_cached_tokens: int = 0  # of the cached, those an earlier blended answer stored

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["chunk_refs"] = [r.model_dump() for r in self.chunk_refs]
        return body


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
        approx_cached_tokens=int(details.get("approx_cached_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prefix_tokens=prepared.prompt.prefix_len, prefix_hash=prepared.prefix_hash,
        matched_blocks=matched, chunk_refs=prepared.prompt.chunk_refs,
        doc_ids=tuple(dict.fromkeys(c.doc_id for c in prepared.chunks)),
        finish_reason=result.finish_reason, failed_workers=tuple(failed), routing=routing,
    )


def query_event(prepared: PreparedQuery, answer: Answer) -> QueryEvent:
    """The rag.queries record of an answered query (block hashes of the prefix only)."""
    return QueryEvent(
        tenant=answer.tenant, question=answer.question[:8192], qid=answer.qid,
        chunk_refs=list(answer.chunk_refs), prefix_hash=prepared.prefix_hash,
        block_hashes=list(prepared.prefix_hashes), prefix_tokens=prepared.prompt.prefix_len,
        prompt_tokens=answer.prompt_tokens, cached_tokens=answer.cached_tokens,
        ttft_ms=answer.ttft_ms, worker_id=answer.worker_id,
    )


# --- what both shells hold ------------------------------------------------------------------------
class ClientCore(Generic[P]):
    """What the sync and async clients share besides their I/O: the configuration, the
    prompt builder, the worker table and in-flight counts they route by while the streams
    app is down, the pools to the workers (`P`: an httpx.Client or AsyncClient, opened by
    `open_pool`), and the steps between their requests."""

    def __init__(self, config: ClientConfig, prompts: PromptBuilder,
                 retrieval: RetrievalBackend | None, emitter: QueryEmitter | None,
                 open_pool: Callable[[str], P]):
        self.config = config
        self.pools: dict[str, P] = {}
        self._open_pool = open_pool
        self.settings = config.settings
        self.prompts = prompts
        self.retrieval = retrieval  # None: retrieve through the streams app
        self.emitter = emitter  # None: answered queries are not published
        self.table = fallback.WorkerTable()  # workers last learned, routed by if the app is down
        self.in_flight = fallback.InFlight()  # this client's open requests: the load it sees
        # Opened while the streams app was down (`open(streams_optional=True)`): its prompt
        # parameters are checked before the first request it is sent, not at open.
        self.contract_pending = False

    @property
    def top_k(self) -> int:
        return self.config.top_k

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def pool(self, url: str) -> P:
        """The keep-alive pool to one worker, opened on first use."""
        pool = self.pools.get(url)
        if pool is None:
            pool = self.pools[url] = self._open_pool(url)
        return pool

    def learn(self, workers: Iterable[WorkerRef]) -> list[str]:
        """Route by these workers while the streams app is down; their ids."""
        self.table.learn(workers, time.monotonic())
        return [w.worker_id for w in workers]

    def opened_without_streams(self, exc: StreamsUnavailable) -> None:
        """Serve without the streams app for now; check its prompt contract on first contact."""
        log.warning("opened without the streams app (%s): routing by this client's own view "
                    "or by load, and its prompt parameters are checked once it answers", exc)
        self.contract_pending = True

    def contract_checked(self, health: dict) -> None:
        """The deferred check of `open`: PromptMismatch, naming the setting, if the app that
        now answers builds prompts otherwise (its routes would never match a held prefix)."""
        check_prompt(health, self.config.params, self.settings.streams_url)
        self.contract_pending = False

    def routed(self, body: Mapping[str, Any]) -> Route:
        """The streams app's route answer, its ready workers learned."""
        route = Route.from_json(body)
        self.learn(route.workers)
        return route

    def route_by_load(self, exc: StreamsUnavailable) -> tuple[Route, str]:
        """The route while the streams app does not answer: by load, labelled as a fallback."""
        log.warning("routing by load without the streams app: %s", exc)
        return fallback.fallback_route(self.table, self.in_flight, time.monotonic(),
                                       self.settings.worker_table_max_age_s, exc)

    def workers_for(self, route: Route) -> list[WorkerRef]:
        return workers_to_try(route, self.settings.max_attempts, self.settings.streams_url)

    @contextmanager
    def attempt(self, worker: WorkerRef, result: StreamResult) -> Iterator[None]:
        """One completion request to a worker, streaming into `result`: counted in flight
        while it runs. A broken connection, or a stream that ends before the answer is
        complete, is a WorkerFailed, so the next worker is tried."""
        self.in_flight.start(worker.worker_id)
        try:
            yield
        except httpx.TransportError as exc:
            raise WorkerFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            self.in_flight.end(worker.worker_id)
        result.check_complete()

    def answered(self, prepared: PreparedQuery, route: Route, routing: str, worker: WorkerRef,
                 result: StreamResult, failed: list[str], started: float,
                 route_ms: float) -> Answer:
        """The answer of a routed query, its QueryEvent published (the emitter queues it)."""
        matched = route.matched_blocks if worker == route.chosen else 0
        answer = build_answer(prepared, worker, result, failed, started, route_ms, matched,
                              routing)
        if self.emitter is not None:
            self.emitter.emit(query_event(prepared, answer))
        return answer

    def body(self, prepared: PreparedQuery, max_tokens: int | None,
             temperature: float | None = None, chunk_reuse: bool = True) -> dict:
        temperature = self.settings.temperature if temperature is None else temperature
        return completion_body(prepared, max_tokens or self.settings.max_tokens, temperature,
                               chunk_reuse)
