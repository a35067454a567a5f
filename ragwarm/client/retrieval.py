"""Retrieval beside the streams app: a question's top-k chunks straight from Qdrant, for the
sync and async clients alike (through the streams app, each shell asks it itself)."""

from __future__ import annotations

from typing import Any, Protocol

from ragwarm.client.wire import RetrievedChunk
from ragwarm.settings import ModelSettings, qdrant_settings


class RetrievalBackend(Protocol):
    """Where the client gets a question's top-k chunks (not `rag.retrieve.Retrieval`, the
    result of one search)."""

    def retrieve(self, question: str, tenant: str, k: int) -> list[RetrievedChunk]: ...

    def close(self) -> None: ...


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
