"""Question → top-k chunks with their refs, against a `ChunkStore` this process holds.

In the embedded setup only the streams app holds the local store (see `rag.store`); other
processes ask it over HTTP and get the same `Retrieval` fields back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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


# Question vectors kept (384 float32 each: 1.5 KiB, so 6 MiB at most). The streams app
# retrieves the same questions again and again: a KB change re-checks up to
# `edit_recheck_questions` recently asked ones, an invalidated prefix's questions are
# retrieved again, and the hot set's every tick. A question's vector never changes.
QUESTION_VECTORS = 4096


class Retriever:
    """Embeds questions and searches the store; `top_k` is 3 unless told otherwise.

    The vectors of the last `QUESTION_VECTORS` distinct questions are kept, least recently
    used dropped first; `reused` counts the embeddings they saved."""

    def __init__(self, store: ChunkStore, embedder: Embedder, top_k: int = 3) -> None:
        self.store = store
        self.embedder = embedder
        self.top_k = top_k
        self.reused = 0
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # the store's thread and the web views may both ask

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
        vectors = self._embed(questions)
        limit = k or self.top_k
        return [
            Retrieval(q, tenant, tuple(self.store.search(v, limit, tenant)))
            for q, v in zip(questions, vectors, strict=True)
        ]

    def _embed(self, questions: Sequence[str]) -> list[np.ndarray]:
        """One vector per question: those kept, the others embedded in one batch."""
        with self._lock:
            kept = {q: self._vectors[q] for q in questions if q in self._vectors}
        missing = [q for q in dict.fromkeys(questions) if q not in kept]
        if missing:  # outside the lock: an embedding takes milliseconds per question
            for q, row in zip(missing, self.embedder.embed(missing, progress=False), strict=True):
                row = row.copy()  # not a view that keeps its whole batch alive
                row.flags.writeable = False  # shared by every later retrieval of q
                kept[q] = row
        with self._lock:
            self.reused += len(questions) - len(missing)
            for q in questions:
                self._vectors[q] = kept[q]
                self._vectors.move_to_end(q)
            while len(self._vectors) > QUESTION_VECTORS:
                self._vectors.popitem(last=False)
        return [kept[q] for q in questions]
