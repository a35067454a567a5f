"""What an index replica's owner publishes for a document, over deterministic stand-in
vectors, for the tests of the replica (`rag.replica`) and of the streams app reading it."""

from __future__ import annotations

import numpy as np

from rag.chunking import Chunk, content_hash
from rag.replica import outgoing
from rag.store import DocRecord

DIM = 4


def chunks_of(doc_id: str, texts: list[str]) -> list[Chunk]:
    return [Chunk(doc_id, i, t, content_hash(t), len(t)) for i, t in enumerate(texts)]


def vec(text: str) -> np.ndarray:
    rng = np.random.default_rng(abs(hash(text)) % 2**32)
    return rng.standard_normal(DIM).astype(np.float32)


def publish(doc_id: str, version: int, texts: list[str], before: list[str] | None = None,
            tenant: str = "t", slots: int | None = None, deleted: bool = False):
    """The records the owner sends after indexing `texts` as `version` (the store's slots
    never shrink, as `ChunkStore.write_document` keeps them)."""
    chunks = chunks_of(doc_id, texts)
    removed = [f"{doc_id}#{i}" for i in range(len(texts), len(before or []))]
    wide = max(len(texts), len(before or [])) if slots is None else slots
    record = DocRecord(doc_id, tenant, version, deleted, wide)
    return outgoing(record, chunks, {c.content_hash: vec(c.text) for c in chunks}, removed)
