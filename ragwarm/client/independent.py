"""The gateway's client: `AsyncRagClient` routing by its own worker view and retrieving from
its own index replica, so the query path does not wait on the streams app (the gateway, and
`bench faults`' query load, which measures that path).

Retrieval, in `RAGWARM_GATEWAY_RETRIEVAL` order of preference (`retrieval_plan`): a Qdrant
server when one is configured (every part sees one index); else the gateway's replica of
`rag.chunks` once it has caught up (the same records and apply logic a second streams
instance uses, `rag.replica`, into an in-memory store: local mode on a path opens in one
process only, and the streams app holds it); else the streams app. Routing: the gateway's
`WorkerView` while it is fresh, else the streams app, else by load (`client.view`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rag.settings import QdrantSettings, RagSettings
from ragwarm.client.arag import AsyncRagClient
from ragwarm.client.fallback import ROUTED, fallback_route
from ragwarm.client.feeds import TopicFeed, worker_events_apply
from ragwarm.client.rag import PreparedQuery, QdrantRetrieval
from ragwarm.client.settings import ClientSettings
from ragwarm.client.view import (
    EVENTS,
    FALLBACK_STALE_VIEW,
    ViewRules,
    WorkerView,
    fresh_route,
    stale_route,
)
from ragwarm.client.wire import RetrievedChunk, Route, StreamsUnavailable
from ragwarm.settings import KafkaSettings, ModelSettings
from schemas import SchemaError
from schemas.chunks import ReplicaRecord, decode_record
from schemas.topics import RAG_CHUNKS, WORKER_EVENTS

log = logging.getLogger(__name__)

Mode = Literal["streams", "replica", "qdrant", "auto"]


@dataclass(frozen=True)
class RetrievalPlan:
    """What the gateway's client retrieves from: `client` as the plain client would
    (`streams` or `qdrant`), and whether it keeps a replica, and must wait for it."""

    client: Literal["streams", "qdrant"]
    replica: bool = False
    replica_only: bool = False  # `replica`: never the streams app, even while catching up


def replica_missing() -> str | None:
    """What a replica needs and this install lacks (the `client` extra alone has neither an
    embedder nor Qdrant's in-memory store), or None."""
    import importlib.util

    lacking = [m for m in ("qdrant_client", "sentence_transformers")
               if importlib.util.find_spec(m) is None]
    return ", ".join(lacking) or None


def retrieval_plan(mode: Mode, qdrant_url: str | None) -> RetrievalPlan:
    """`auto`: a Qdrant server with a URL, else the replica (the streams app until it has
    caught up); `qdrant` without a URL is refused at start, with the fix."""
    if mode == "qdrant" and not qdrant_url:
        raise ValueError("RAGWARM_GATEWAY_RETRIEVAL=qdrant needs RAGWARM_QDRANT_URL (the Qdrant "
                         "server the streams app indexes into); set it, or use replica/auto")
    if mode == "qdrant" or (mode == "auto" and qdrant_url):
        return RetrievalPlan("qdrant")
    if mode == "streams":
        return RetrievalPlan("streams")
    return RetrievalPlan("streams", replica=True, replica_only=mode == "replica")


class ReplicaNotReady(StreamsUnavailable):
    """`RAGWARM_GATEWAY_RETRIEVAL=replica` and the replica has not read rag.chunks yet."""


class ReplicaIndex:
    """The index rebuilt from `rag.chunks` in an in-memory store, searched as the streams app
    searches its own. The feed thread writes, queries read: one lock, since the in-memory
    store is not meant to be used from two threads at once."""

    def __init__(self, store: Any, retrieval: QdrantRetrieval) -> None:
        self.store, self.retrieval = store, retrieval
        self.malformed = 0  # records that are not rag.chunks records (the app dead-letters)
        self.refused = 0  # chunks of another embedder (another vector size)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, models: ModelSettings, rag: RagSettings) -> ReplicaIndex:
        from qdrant_client import QdrantClient

        from rag.retrieve import Retriever
        from rag.store import ChunkStore
        from ragwarm.models import load_embedder

        embedder = load_embedder(models, batch_size=rag.embed_batch_size)
        store = ChunkStore(QdrantClient(location=":memory:"), rag.collection, embedder.dim,
                           local=True)
        return cls(store, QdrantRetrieval(Retriever(store, embedder, rag.top_k)))

    def apply(self, messages: Sequence[Any]) -> None:
        """Bring the store to one batch of rag.chunks records (`rag.replica.apply_batch`)."""
        from rag.replica import apply_batch, refused  # qdrant-client: the streams extra

        records: list[ReplicaRecord] = []
        for msg in messages:
            try:
                records.append(decode_record(msg.key, msg.value, list(msg.headers or ())))
            except SchemaError as exc:
                self.malformed += 1
                log.debug("a malformed rag.chunks record skipped: %s", exc)
        bad = refused(records, self.store.dim, self.store.collection)
        self.refused += len(bad)
        records = [r for i, r in enumerate(records) if i not in bad]
        with self._lock:
            apply_batch(self.store, records)

    def retrieve(self, question: str, tenant: str, k: int) -> list[RetrievedChunk]:
        with self._lock:
            return self.retrieval.retrieve(question, tenant, k)

    def close(self) -> None:
        self.store.close()


class GatewayClient(AsyncRagClient):
    """`AsyncRagClient` with the gateway's own worker view and index replica (`attach`)."""

    view: WorkerView | None = None
    replica: ReplicaIndex | None = None
    replica_only = False
    feeds: tuple[TopicFeed, ...] = ()

    def attach(self, view: WorkerView | None, replica: ReplicaIndex | None,
               feeds: Sequence[TopicFeed], replica_only: bool = False) -> None:
        self.view, self.replica, self.replica_only = view, replica, replica_only
        self.feeds = tuple(feeds)

    @property
    def replica_ready(self) -> bool:
        feed = self._replica_feed()
        return self.replica is not None and feed is not None and feed.caught_up.is_set()

    def _replica_feed(self) -> TopicFeed | None:
        return next((f for f in self.feeds if f.topic.endswith(RAG_CHUNKS)), None)

    async def _retrieve(self, question: str, tenant: str) -> list[RetrievedChunk]:
        if self.replica is not None and self.replica_ready:
            found = await asyncio.to_thread(self.replica.retrieve, question, tenant, self.top_k)
            if found or self.replica_only:
                return found
            # auto: an empty replica may be one nothing is published to (a single streams
            # instance with RAGWARM_STREAMS_INDEX_REPLICA=false): the app's index decides.
            try:
                return await super()._retrieve(question, tenant)
            except StreamsUnavailable:
                return found
        if self.replica_only:
            feed = self._replica_feed()
            read = feed.records if feed is not None else 0
            raise ReplicaNotReady(f"the gateway's index replica is still reading rag.chunks "
                                  f"({read} records so far); RAGWARM_GATEWAY_RETRIEVAL=auto "
                                  "asks the streams app meanwhile")
        return await super()._retrieve(question, tenant)

    async def _route(self, prepared: PreparedQuery) -> tuple[Route, str]:
        """The gateway's own view while fresh; else the streams app; else any worker the
        view (or, knowing none, the client's table) last knew healthy, by load."""
        if self.view is not None:
            route = fresh_route(self.view, prepared.block_hashes, time.time())
            if route is not None:
                self.table.learn(route.workers, time.monotonic())
                return route, EVENTS
        stale = stale_route(self.view, self.in_flight) if self.view is not None else None
        try:
            routed = await self.route(prepared)
        except StreamsUnavailable as exc:
            log.warning("routing by load: no fresh worker view, no streams app: %s", exc)
            if stale is not None:
                return stale, FALLBACK_STALE_VIEW
            return fallback_route(self.table, self.in_flight, time.monotonic(),
                                  self.settings.worker_table_max_age_s, exc)
        if not routed.workers and stale is not None:
            # The app's table went stale too (the broker away past its worker horizon):
            # the workers the view last knew healthy still serve; failover skips a dead one.
            return stale, FALLBACK_STALE_VIEW
        return routed, ROUTED

    async def aclose(self) -> None:
        for feed in self.feeds:
            await asyncio.to_thread(feed.close)
        await super().aclose()
        if self.replica is not None:
            self.replica.close()


@dataclass(frozen=True)
class OwnPath:
    """What the gateway's client reads itself: where it retrieves (`retrieval_plan`), and
    whether and how it keeps its own worker view (None: every route is asked of the app)."""

    retrieval: Mode = "auto"
    view: ViewRules | None = ViewRules(None)
    view_replay_s: float = 60.0  # how far back worker.events is read at start


async def open_gateway_client(path: OwnPath, client_settings: ClientSettings,
                              models: ModelSettings, kafka: KafkaSettings | None = None,
                              ) -> GatewayClient:
    """The gateway's client, with its worker view and index replica following their topics
    (each as `path` asks)."""
    kafka = kafka or KafkaSettings()
    plan = retrieval_plan(path.retrieval, QdrantSettings().url)
    lacking = replica_missing() if plan.replica else None
    if lacking and plan.replica_only:
        raise ValueError(f"RAGWARM_GATEWAY_RETRIEVAL=replica needs {lacking} (pip install "
                         "'ragwarm[streams]'); or use auto, which asks the streams app")
    if lacking:
        log.warning("no index replica in this gateway (%s not installed): retrieval asks the "
                    "streams app; install 'ragwarm[streams]' to retrieve without it", lacking)
        plan = RetrievalPlan(plan.client)
    client_settings = client_settings.model_copy(update={"retrieval": plan.client})
    # With its own view and its own index, the gateway serves before the streams app is up
    # (or while it restarts): the prompt contract is checked when the app first answers.
    alone = path.view is not None and (plan.replica or plan.client == "qdrant")
    client = await GatewayClient.open(client_settings, kafka, models, streams_optional=alone)
    assert isinstance(client, GatewayClient)  # `open` builds `cls`; typed as its base
    view, replica, feeds = None, None, []
    try:
        if path.view is not None:
            view = WorkerView(path.view)
            feeds.append(TopicFeed(kafka, kafka.topic(WORKER_EVENTS), worker_events_apply(view),
                                   since_s=path.view_replay_s).start())
        if plan.replica:
            replica = await asyncio.to_thread(ReplicaIndex.open, models, RagSettings())
            feeds.append(TopicFeed(kafka, kafka.topic(RAG_CHUNKS), replica.apply).start())
        client.attach(view, replica, feeds, plan.replica_only)
    except BaseException:
        for feed in feeds:
            feed.close()
        await client.aclose()
        raise
    return client
