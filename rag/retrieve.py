"""Question → top-k chunks with their refs, against a `ChunkStore` this process holds.

In the embedded setup only the streams app holds the local store (see `rag.store`); other
processes ask it over HTTP and get the same `Retrieval` fields back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rag.chunking import Chunk
from rag.embed import Embedder
from rag.store import ChunkStore, StoredChunk
from schemas import ChunkRef


@dataclass(frozen=True)
class Retrieval:
    """The chunks retrieved for one question, best first."""

    question: str
    tenant: str | None
    hits: tuple[StoredChunk, ...]

    @property
    def chunks(self) -> list[Chunk]:
        return [h.chunk for h in self.hits]

    @property
    def refs(self) -> list[ChunkRef]:
        """Refs in score order (the prompt puts them in canonical order)."""
        return [h.chunk.ref for h in self.hits]

    @property
    def doc_ids(self) -> list[str]:
        return list(dict.fromkeys(h.chunk.doc_id for h in self.hits))


class Retriever:
    """Embeds questions and searches the store; `top_k` is 3 unless told otherwise."""

    def __init__(self, store: ChunkStore, embedder: Embedder, top_k: int = 3) -> None:
        self.store = store
        self.embedder = embedder
        self.top_k = top_k

    def retrieve(self, question: str, tenant: str | None = None, k: int | None = None) -> Retrieval:
        return self.retrieve_many([question], tenant, k)[0]

    def retrieve_many(
        self, questions: Sequence[str], tenant: str | None = None, k: int | None = None
    ) -> list[Retrieval]:
        """One retrieval per question; the questions are embedded in one batch."""
        if not questions:
            return []
        if not self.store.may_hold(tenant):  # no embedder pass for an empty index
            return [Retrieval(q, tenant, ()) for q in questions]
        vectors = self.embedder.embed(list(questions), progress=False)
        limit = k or self.top_k
        return [
            Retrieval(q, tenant, tuple(self.store.search(v, limit, tenant)))
            for q, v in zip(questions, vectors, strict=True)
        ]
