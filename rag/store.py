"""The Qdrant chunk store: chunk vectors with their identity, and one version record per document.

Who opens the store. Qdrant local mode (the default, an on-disk path) allows one process
per path. In the embedded setup the streams app owns it: its KB-change agent indexes
documents and its web views serve retrieval to every other process (RAG clients, CLI,
benchmarks reach it over HTTP). With `RAGWARM_QDRANT_URL` set, a Qdrant server holds the
data and every process may connect directly. Benchmarks and tests open their own paths.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from rag.chunking import Chunk
from rag.settings import QdrantSettings

# Fixed namespace so point ids are stable across processes and releases.
_NAMESPACE = uuid.UUID("6f1d7f2e-3b8a-5c4e-9a51-2d0c8e7b4a10")
_PAGE = 512
_INDEXED_FIELDS = ("tenant", "doc_id", "content_hash")


class StoreError(RuntimeError):
    """The store cannot be opened or does not match what ragwarm expects."""


def point_id(tenant: str, chunk_id: str) -> str:
    """The Qdrant id of a chunk: uuid5 of (tenant, chunk_id)."""
    return str(uuid.uuid5(_NAMESPACE, f"chunk\x00{tenant}\x00{chunk_id}"))


def doc_point_id(tenant: str, doc_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"doc\x00{tenant}\x00{doc_id}"))


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as stored: with its tenant, the document version it is current at, and a score."""

    chunk: Chunk
    tenant: str
    version: int
    score: float = 0.0


@dataclass(frozen=True)
class DocRecord:
    """The newest version seen of a document; `deleted` keeps the version of a delete."""

    doc_id: str
    tenant: str
    version: int
    deleted: bool


def open_client(settings: QdrantSettings) -> QdrantClient:
    """A client for the server at `settings.url`, or local mode on `settings.path`."""
    if settings.url:
        key = settings.api_key.get_secret_value() if settings.api_key else None
        return QdrantClient(url=settings.url, api_key=key, timeout=settings.timeout_s)
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


class ChunkStore:
    """Chunk points in `<collection>` and document records in `<collection>_docs`."""

    def __init__(self, client: QdrantClient, collection: str, dim: int, local: bool) -> None:
        self.client = client
        self.collection = collection
        self.docs = f"{collection}_docs"
        self.dim = dim
        self._local = local
        self._ensure_collections()

    @classmethod
    def open(cls, settings: QdrantSettings, collection: str, dim: int) -> ChunkStore:
        return cls(open_client(settings), collection, dim, local=not settings.url)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_collections(self) -> None:
        if self.client.collection_exists(self.collection):
            size = self.client.get_collection(self.collection).config.params.vectors
            found = getattr(size, "size", None)
            if found != self.dim:
                raise StoreError(
                    f"collection {self.collection!r} holds {found}-dimensional vectors, "
                    f"the embedder makes {self.dim}; use another RAGWARM_RAG_COLLECTION"
                )
        else:
            params = qm.VectorParams(size=self.dim, distance=qm.Distance.COSINE)
            self.client.create_collection(self.collection, vectors_config=params)
            # Local mode has no payload indexes (and warns about them); servers need them.
            if not self._local:
                for name in _INDEXED_FIELDS:
                    self.client.create_payload_index(
                        self.collection, name, qm.PayloadSchemaType.KEYWORD
                    )
        if not self.client.collection_exists(self.docs):
            self.client.create_collection(self.docs, vectors_config={})

    def doc_record(self, doc_id: str, tenant: str = "default") -> DocRecord | None:
        found = self.client.retrieve(self.docs, [doc_point_id(tenant, doc_id)], with_payload=True)
        if not found:
            return None
        payload = found[0].payload or {}
        return DocRecord(doc_id, tenant, int(payload["version"]), bool(payload["deleted"]))

    def put_doc_record(self, record: DocRecord) -> None:
        payload = {
            "doc_id": record.doc_id,
            "tenant": record.tenant,
            "version": record.version,
            "deleted": record.deleted,
        }
        point = qm.PointStruct(
            id=doc_point_id(record.tenant, record.doc_id), vector={}, payload=payload
        )
        self.client.upsert(self.docs, [point])

    def doc_records(self, tenant: str | None = None) -> Iterator[DocRecord]:
        for point in self._scroll(self.docs, _tenant_filter(tenant), vectors=False):
            p = point.payload or {}
            yield DocRecord(p["doc_id"], p["tenant"], int(p["version"]), bool(p["deleted"]))

    def doc_version(self, doc_id: str, tenant: str = "default") -> int | None:
        """The newest version applied (upsert or delete); None for a document never seen."""
        record = self.doc_record(doc_id, tenant)
        return None if record is None else record.version

    def current_chunks(self, doc_id: str, tenant: str = "default") -> list[StoredChunk]:
        """The chunks stored for a document, by ordinal (none once it is deleted)."""
        flt = _filter(tenant=tenant, doc_id=doc_id)
        chunks = [_stored(p) for p in self._scroll(self.collection, flt, vectors=False)]
        return sorted(chunks, key=lambda s: s.chunk.ordinal)

    def get_chunks(
        self, chunk_ids: Sequence[str], tenant: str = "default"
    ) -> dict[str, StoredChunk]:
        """Stored chunks by id; ids not in the store are absent from the result."""
        ids = [point_id(tenant, c) for c in chunk_ids]
        points = self.client.retrieve(self.collection, ids, with_payload=True) if ids else []
        found = (_stored(p) for p in points)
        return {s.chunk.chunk_id: s for s in found}

    def vectors_by_hash(self, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """Vectors already stored for these content hashes (any tenant, any document)."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        flt = qm.Filter(must=[qm.FieldCondition(key="content_hash", match=qm.MatchAny(any=wanted))])
        out: dict[str, np.ndarray] = {}
        for point in self._scroll(self.collection, flt, vectors=True):
            out.setdefault((point.payload or {})["content_hash"], np.asarray(point.vector))
        return out

    def upsert_chunks(
        self, tenant: str, version: int, chunks: Sequence[Chunk], vectors: Sequence[np.ndarray]
    ) -> None:
        points = [
            qm.PointStruct(
                id=point_id(tenant, c.chunk_id),
                vector=[float(x) for x in v],
                payload=_payload(c, tenant, version),
            )
            for c, v in zip(chunks, vectors, strict=True)
        ]
        for start in range(0, len(points), _PAGE):
            self.client.upsert(self.collection, points[start : start + _PAGE])

    def set_version(self, tenant: str, chunk_ids: Sequence[str], version: int) -> None:
        if chunk_ids:
            ids: list[Any] = [point_id(tenant, c) for c in chunk_ids]
            self.client.set_payload(self.collection, {"version": version}, points=ids)

    def delete_chunks(self, tenant: str, chunk_ids: Sequence[str]) -> None:
        if chunk_ids:
            ids: list[Any] = [point_id(tenant, c) for c in chunk_ids]
            self.client.delete(self.collection, points_selector=qm.PointIdsList(points=ids))

    def search(self, vector: np.ndarray, k: int, tenant: str | None = None) -> list[StoredChunk]:
        """The `k` nearest chunks by cosine similarity, best first."""
        response = self.client.query_points(
            self.collection,
            query=[float(x) for x in vector],
            limit=k,
            query_filter=_tenant_filter(tenant),
            with_payload=True,
        )
        return [_stored(p, p.score) for p in response.points]

    def count(self, tenant: str | None = None) -> int:
        return self.client.count(
            self.collection, count_filter=_tenant_filter(tenant), exact=True
        ).count

    def all_chunks(self, tenant: str | None = None) -> Iterator[StoredChunk]:
        for point in self._scroll(self.collection, _tenant_filter(tenant), vectors=False):
            yield _stored(point)

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


def _payload(chunk: Chunk, tenant: str, version: int) -> dict[str, Any]:
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


def _filter(**values: str) -> qm.Filter:
    return qm.Filter(
        must=[qm.FieldCondition(key=k, match=qm.MatchValue(value=v)) for k, v in values.items()]
    )


def _tenant_filter(tenant: str | None) -> qm.Filter | None:
    return None if tenant is None else _filter(tenant=tenant)
