"""The Qdrant chunk store: chunk vectors with their identity, and one version record per document.

Who opens the store. Qdrant local mode (the default, an on-disk path) allows one process
per path. In the embedded setup the streams app owns it: its KB-change agent indexes
documents and its web views serve retrieval to every other process (RAG clients, CLI,
benchmarks reach it over HTTP). With `RAGWARM_QDRANT_URL` set, a Qdrant server holds the
data and every process may connect directly. Benchmarks and tests open their own paths.

Lookups go by point id wherever they can: local mode evaluates payload filters in Python,
point by point, so a filtered scroll costs milliseconds per thousand chunks.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from rag.chunking import Chunk, chunk_id
from rag.settings import QdrantSettings

# Fixed namespace so point ids are stable across processes and releases.
_NAMESPACE = uuid.UUID("6f1d7f2e-3b8a-5c4e-9a51-2d0c8e7b4a10")
_PAGE = 512
_INDEXED_FIELDS = ("tenant", "doc_id", "content_hash")
_TENANTS_ID = str(uuid.uuid5(_NAMESPACE, "tenants"))


class StoreError(RuntimeError):
    """The store cannot be opened or does not match what ragwarm expects."""


def point_id(tenant: str, chunk_id: str) -> str:
    """The Qdrant id of a chunk: uuid5 of (tenant, chunk_id)."""
    return str(uuid.uuid5(_NAMESPACE, f"chunk\x00{tenant}\x00{chunk_id}"))


def doc_point_id(tenant: str, doc_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"doc\x00{tenant}\x00{doc_id}"))


def vector_point_id(content_hash: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"vector\x00{content_hash}"))


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as stored: with its tenant, the document version it is current at, and a score."""

    chunk: Chunk
    tenant: str
    version: int
    score: float = 0.0


@dataclass(frozen=True)
class DocRecord:
    """The newest version applied to a document (None while its first write is under way);
    `deleted` keeps the version of a delete; `slots` bounds the ordinals ever written."""

    doc_id: str
    tenant: str
    version: int | None
    deleted: bool
    slots: int = 0


@dataclass(frozen=True)
class DocWrite:
    """One document's new state: chunks to (re)write, chunks to re-stamp, chunks to drop."""

    record: DocRecord
    upserts: Sequence[Chunk]
    vectors: Sequence[np.ndarray]
    restamp: Sequence[str] = ()
    deletes: Sequence[str] = ()


def open_client(settings: QdrantSettings) -> QdrantClient:
    """A client for the server at `settings.url`, or local mode on `settings.path`."""
    if settings.url:
        key = settings.api_key.get_secret_value() if settings.api_key else None
        return QdrantClient(url=settings.url, api_key=key, timeout=settings.timeout_s)
    if settings.path is None:
        raise ValueError("Qdrant local mode needs a path (RAGWARM_QDRANT_PATH) or a server URL")
    settings.path.mkdir(parents=True, exist_ok=True)
    try:
        return QdrantClient(path=str(settings.path))
    except RuntimeError as exc:
        raise StoreError(
            f"the local Qdrant store at {settings.path} is open in another process "
            "(local mode allows one process per path). In the embedded setup the streams "
            "app owns it and serves retrieval over HTTP; stop the other process, or set "
            "RAGWARM_QDRANT_URL to a Qdrant server so every part can connect."
        ) from exc


def relax_local_commits(client: Any) -> int:
    """Switch a Qdrant local-mode store's SQLite files to WAL with synchronous=NORMAL;
    returns how many files were switched.

    Local mode commits every point in a transaction of its own, with SQLite's defaults
    (rollback journal, a disk sync per commit): on a busy disk each commit cost about 20 ms,
    more than embedding the chunk, and on a quiet one 18 of the 34 s the indexer spent
    outside embedding over the Argo CD trace (docs/lab/benchmarks-notebook.md). In WAL with
    synchronous=NORMAL a commit survives a crash of the process and costs about 0.2 ms; a
    power cut may lose the last commits of each file, each file its own: remove the
    store's folder and the app rebuilds it from Kafka (`streams.shell.replica`,
    `streams.shell.recovery`), or set RAGWARM_QDRANT_LOCAL_SYNC=full. The files are reached
    through qdrant-client's local internals; a client without them (a server, another
    version) is left as it is."""
    collections = getattr(getattr(client, "_client", None), "collections", None)
    if not isinstance(collections, dict):
        return 0
    switched = 0
    for collection in collections.values():
        conn = getattr(getattr(collection, "storage", None), "storage", None)
        if isinstance(conn, sqlite3.Connection):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            switched += 1
    return switched


class ChunkStore:
    """Chunks in `<name>`, document records and the tenant list in `<name>_docs`, and
    vectors by content hash in `<name>_vectors` (so a text seen before is never re-embedded)."""

    def __init__(self, client: QdrantClient, collection: str, dim: int, local: bool) -> None:
        self.client = client
        self.collection = collection
        self.docs = f"{collection}_docs"
        self.vectors = f"{collection}_vectors"
        self.dim = dim
        self._local = local
        self._ensure_collections()
        self._tenants = self._load_tenants()

    @classmethod
    def open(cls, settings: QdrantSettings, collection: str, dim: int) -> ChunkStore:
        store = cls(open_client(settings), collection, dim, local=not settings.url)
        if settings.local and settings.local_sync == "normal":
            relax_local_commits(store.client)
        return store

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- documents ----------------------------------------------------------------------
    def doc_record(self, doc_id: str, tenant: str = "default") -> DocRecord | None:
        found = self.client.retrieve(self.docs, [doc_point_id(tenant, doc_id)], with_payload=True)
        return _record(found[0].payload or {}) if found else None

    def doc_version(self, doc_id: str, tenant: str = "default") -> int | None:
        """The newest version applied (upsert or delete); None for a document never seen."""
        record = self.doc_record(doc_id, tenant)
        return None if record is None else record.version

    def doc_records(self, tenant: str | None = None) -> Iterator[DocRecord]:
        for point in self._scroll(self.docs, self._tenant_filter(tenant), vectors=False):
            payload = point.payload or {}
            if "doc_id" in payload:
                yield _record(payload)

    def write_document(self, write: DocWrite) -> None:
        """Apply one document's new state so that a crash part-way can be re-applied:
        the ordinal bound first, then the points, then the record with its version."""
        record = write.record
        self._register_tenant(record.tenant)
        previous = self.doc_record(record.doc_id, record.tenant)
        slots = max(record.slots, previous.slots if previous else 0)
        if slots > (previous.slots if previous else 0):
            widened = previous or replace(record, version=None)
            self._put_record(replace(widened, slots=slots))
        self._upsert_chunks(record, write.upserts, write.vectors)
        if write.restamp:
            ids: list[Any] = [point_id(record.tenant, c) for c in write.restamp]
            self.client.set_payload(self.collection, {"version": record.version}, points=ids)
        self._delete_chunks(record.tenant, write.deletes)
        self._put_record(replace(record, slots=slots))

    # --- chunks -------------------------------------------------------------------------
    def current_chunks(self, doc_id: str, tenant: str = "default") -> list[StoredChunk]:
        """The chunks stored for a document, by ordinal (none once it is deleted)."""
        record = self.doc_record(doc_id, tenant)
        if record is None or not record.slots:
            return []
        found = self.get_chunks([chunk_id(doc_id, i) for i in range(record.slots)], tenant)
        return sorted(found.values(), key=lambda s: s.chunk.ordinal)

    def get_chunks(
        self, chunk_ids: Sequence[str], tenant: str = "default"
    ) -> dict[str, StoredChunk]:
        """Stored chunks by id; ids not in the store are absent from the result."""
        ids = [point_id(tenant, c) for c in chunk_ids]
        points = self.client.retrieve(self.collection, ids, with_payload=True) if ids else []
        found = (_stored(p) for p in points)
        return {s.chunk.chunk_id: s for s in found}

    def search(self, vector: np.ndarray, k: int, tenant: str | None = None) -> list[StoredChunk]:
        """The `k` nearest chunks by cosine similarity, best first."""
        response = self.client.query_points(
            self.collection,
            query=[float(x) for x in vector],
            limit=k,
            query_filter=self._tenant_filter(tenant),
            with_payload=True,
        )
        return [_stored(p, p.score) for p in response.points]

    def count(self, tenant: str | None = None) -> int:
        flt = self._tenant_filter(tenant)
        return self.client.count(self.collection, count_filter=flt, exact=True).count

    def all_chunks(self, tenant: str | None = None) -> Iterator[StoredChunk]:
        for point in self._scroll(self.collection, self._tenant_filter(tenant), vectors=False):
            yield _stored(point)

    def tenants(self) -> frozenset[str]:
        return frozenset(self._tenants)

    def may_hold(self, tenant: str | None) -> bool:
        """False only when surely no chunk of `tenant` is stored: a local store's one process
        knows every tenant written (a server's list may be behind other writers')."""
        return tenant is None or not self._local or tenant in self._tenants

    # --- vectors by content hash --------------------------------------------------------
    def vectors_by_hash(self, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """Vectors already computed for these content hashes (by any tenant or document)."""
        wanted = sorted(set(hashes))
        ids = [vector_point_id(h) for h in wanted]
        points = self.client.retrieve(self.vectors, ids, with_payload=True, with_vectors=True)
        return {(p.payload or {})["content_hash"]: _vector(p.vector) for p in points}

    def chunk_vectors(self, chunk_ids: Sequence[str], tenant: str) -> dict[str, np.ndarray]:
        """content hash -> vector of these stored chunks (read from the chunk points)."""
        ids = [point_id(tenant, c) for c in chunk_ids]
        points = self.client.retrieve(self.collection, ids, with_payload=True, with_vectors=True)
        return {(p.payload or {})["content_hash"]: _vector(p.vector) for p in points}

    def save_vectors(self, vectors: Mapping[str, np.ndarray]) -> None:
        points = [
            qm.PointStruct(id=vector_point_id(h), vector=_floats(v), payload={"content_hash": h})
            for h, v in vectors.items()
        ]
        self._upsert(self.vectors, points)

    # --- the replica of rag.chunks (rag.replica) -----------------------------------------
    def doc_records_of(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], DocRecord]:
        """Stored records of these (tenant, doc_id) keys; keys never seen are absent."""
        ids = [doc_point_id(t, d) for t, d in sorted(set(keys))]
        found = (_record(p.payload or {}) for p in self.client.retrieve(self.docs, ids)) if ids \
            else ()
        return {(r.tenant, r.doc_id): r for r in found}

    def apply_replicated(
        self,
        chunks: Sequence[tuple[StoredChunk, np.ndarray]],
        deletes: Sequence[tuple[str, str]],
        records: Sequence[DocRecord],
    ) -> None:
        """Write what a replica batch decided: chunks (each with its version) and their
        vectors by hash, then deletes of (tenant, chunk_id), then the document records."""
        for tenant in sorted({s.tenant for s, _ in chunks} | {r.tenant for r in records}):
            self._register_tenant(tenant)
        points = [
            qm.PointStruct(
                id=point_id(s.tenant, s.chunk.chunk_id),
                vector=_floats(v),
                payload=_payload(s.chunk, s.tenant, s.version),
            )
            for s, v in chunks
        ]
        self._upsert(self.collection, points)
        self.save_vectors({s.chunk.content_hash: v for s, v in chunks})
        if deletes:
            ids: list[Any] = [point_id(t, c) for t, c in deletes]
            self.client.delete(self.collection, points_selector=qm.PointIdsList(points=ids))
        for record in records:
            self._put_record(record)

    def replica_offsets(self, name: str) -> dict[int, int]:
        """partition -> next offset to read of the topic `name` this store replicates."""
        found = self.client.retrieve(self.docs, [_offsets_id(name)], with_payload=True)
        raw = (found[0].payload or {}).get("offsets", {}) if found else {}
        return {int(k): int(v) for k, v in raw.items()}

    def save_replica_offsets(self, name: str, offsets: Mapping[int, int]) -> None:
        # Written after the records they follow: a crash between re-applies them (idempotent).
        payload = {"topic": name, "offsets": {str(k): v for k, v in offsets.items()}}
        point = qm.PointStruct(id=_offsets_id(name), vector={}, payload=payload)
        self.client.upsert(self.docs, [point])

    # --- internals ----------------------------------------------------------------------
    def _ensure_collections(self) -> None:
        params = qm.VectorParams(size=self.dim, distance=qm.Distance.COSINE)
        for name in (self.collection, self.vectors):
            if self.client.collection_exists(name):
                self._check_dim(name)
                continue
            self.client.create_collection(name, vectors_config=params)
            # Local mode has no payload indexes (and warns about them); servers need them.
            if name == self.collection and not self._local:
                for field in _INDEXED_FIELDS:
                    self.client.create_payload_index(name, field, qm.PayloadSchemaType.KEYWORD)
        if not self.client.collection_exists(self.docs):
            self.client.create_collection(self.docs, vectors_config={})

    def _check_dim(self, name: str) -> None:
        found = getattr(self.client.get_collection(name).config.params.vectors, "size", None)
        if found != self.dim:
            raise StoreError(
                f"collection {name!r} holds {found}-dimensional vectors, the embedder "
                f"makes {self.dim}; use another RAGWARM_RAG_COLLECTION"
            )

    def _load_tenants(self) -> set[str]:
        found = self.client.retrieve(self.docs, [_TENANTS_ID], with_payload=True)
        return set((found[0].payload or {}).get("tenants", [])) if found else set()

    def _register_tenant(self, tenant: str) -> None:
        # Recorded before any point of the tenant exists, so the list is never short.
        if tenant in self._tenants:
            return
        self._tenants = self._load_tenants() | {tenant}
        payload = {"tenants": sorted(self._tenants)}
        self.client.upsert(self.docs, [qm.PointStruct(id=_TENANTS_ID, vector={}, payload=payload)])

    def _tenant_filter(self, tenant: str | None) -> qm.Filter | None:
        if tenant is None:
            return None
        # The one process owning a local store knows every tenant in it: when the only
        # tenant is this one, the (slow, per-point) filter would select everything anyway.
        if self._local and self._tenants <= {tenant}:
            return None
        return _filter(tenant=tenant)

    def _put_record(self, record: DocRecord) -> None:
        payload = {
            "doc_id": record.doc_id,
            "tenant": record.tenant,
            "version": record.version,
            "deleted": record.deleted,
            "slots": record.slots,
        }
        point_key = doc_point_id(record.tenant, record.doc_id)
        self.client.upsert(self.docs, [qm.PointStruct(id=point_key, vector={}, payload=payload)])

    def _upsert_chunks(
        self, record: DocRecord, chunks: Sequence[Chunk], vectors: Sequence[np.ndarray]
    ) -> None:
        points = [
            qm.PointStruct(
                id=point_id(record.tenant, c.chunk_id),
                vector=_floats(v),
                payload=_payload(c, record.tenant, record.version),
            )
            for c, v in zip(chunks, vectors, strict=True)
        ]
        self._upsert(self.collection, points)

    def _upsert(self, collection: str, points: list[qm.PointStruct]) -> None:
        for start in range(0, len(points), _PAGE):
            self.client.upsert(collection, points[start : start + _PAGE])

    def _delete_chunks(self, tenant: str, chunk_ids: Sequence[str]) -> None:
        if chunk_ids:
            ids: list[Any] = [point_id(tenant, c) for c in chunk_ids]
            self.client.delete(self.collection, points_selector=qm.PointIdsList(points=ids))

    def _scroll(self, collection: str, flt: qm.Filter | None, vectors: bool) -> Iterator[Any]:
        offset = None
        while True:
            points, offset = self.client.scroll(
                collection,
                scroll_filter=flt,
                limit=_PAGE,
                offset=offset,
                with_payload=True,
                with_vectors=vectors,
            )
            yield from points
            if offset is None:
                return


def _offsets_id(name: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"replica-offsets\x00{name}"))


def _record(payload: dict[str, Any]) -> DocRecord:
    version = payload["version"]
    return DocRecord(
        payload["doc_id"],
        payload["tenant"],
        None if version is None else int(version),
        bool(payload["deleted"]),
        int(payload.get("slots", 0)),
    )


def _payload(chunk: Chunk, tenant: str, version: int | None) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "doc_id": chunk.doc_id,
        "chunk_id": chunk.chunk_id,
        "ordinal": chunk.ordinal,
        "content_hash": chunk.content_hash,
        "version": version,
        "tokens": chunk.tokens,
        "text": chunk.text,
    }


def _stored(point: Any, score: float = 0.0) -> StoredChunk:
    p = point.payload or {}
    chunk = Chunk(p["doc_id"], int(p["ordinal"]), p["text"], p["content_hash"], int(p["tokens"]))
    return StoredChunk(chunk, p["tenant"], int(p["version"]), float(score))


def _floats(vector: np.ndarray) -> list[float]:
    return [float(x) for x in vector]


def _vector(raw: Any) -> np.ndarray:
    return np.asarray(raw, dtype=np.float32)


def _filter(**values: str) -> qm.Filter:
    return qm.Filter(
        must=[qm.FieldCondition(key=k, match=qm.MatchValue(value=v)) for k, v in values.items()]
    )
