"""The index replica on real stores: what one instance indexes (real embedder, SmolLM2
tokenizer, Qdrant local mode) goes through the rag.chunks wire format into another
instance's store, which then retrieves alike and indexes later versions without
re-embedding what it received. (The Kafka path: tests/integration/test_replica.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag.embed import Embedder
from rag.index import Indexer
from rag.prompt import PromptBuilder
from rag.retrieve import Retriever
from rag.settings import QdrantSettings, RagSettings
from rag.store import ChunkStore
from ragwarm.rag_port import RagService
from schemas import KbChange
from schemas.chunks import decode_record
from tests.integration.rag_kit import V1, section

pytestmark = pytest.mark.integration


def service(path: Path, tokenizer: Any, embedder: Embedder) -> RagService:
    settings = RagSettings(chunk_tokens=128)
    store = ChunkStore.open(QdrantSettings(path=path), settings.collection, embedder.dim)
    return RagService(store, Indexer.from_settings(store, embedder, tokenizer, settings),
                      Retriever(store, embedder, 3), PromptBuilder(tokenizer, "sys"),
                      "smollm2", replicated=True)


def ship(source: RagService, target: RagService) -> dict[str, int]:
    """What `source` indexed since last time, through the wire format, into `target`."""
    out, _ = source.take_outgoing()
    return target.apply_replicated([decode_record(r.key, r.value, list(r.headers)) for r in out])


def refs(service: RagService, question: str) -> list[tuple[str, str, int]]:
    return [(h.chunk.chunk_id, h.chunk.content_hash, h.version)
            for h in service.retriever.retrieve(question, "default", 8).hits]


def test_a_replica_retrieves_alike_drops_removed_chunks_and_reuses_vectors(
    tmp_path, tokenizer, embedder
):
    owner = service(tmp_path / "owner", tokenizer, embedder)
    replica = service(tmp_path / "replica", tokenizer, embedder)
    v1 = KbChange(op="upsert", doc_id="guide.md", version=1, text=V1)
    owner.index(v1)
    _, embedded = owner.take_outgoing()
    assert embedded > 0
    owner.index(v1)  # an equal version re-applied (a redelivery) publishes the whole state
    ship(owner, replica)
    assert replica.indexed_versions() == {("default", "guide.md"): 1}
    assert replica.store.count() == owner.store.count()
    question = "How do sync waves order resources?"
    assert refs(replica, question) == refs(owner, question)

    # The owner drops a section and edits another: the replica follows.
    v2_text = "\n\n".join(["# Guide", section("Installing", "installation"),
                           section("Sync waves", "sync wave ordering", 20)])
    owner.index(KbChange(op="upsert", doc_id="guide.md", version=2, text=v2_text))
    counts = ship(owner, replica)
    assert counts["deleted"] > 0
    assert refs(replica, question) == refs(owner, question)
    assert {c.chunk.chunk_id for c in replica.store.all_chunks()} == {
        c.chunk.chunk_id for c in owner.store.all_chunks()}
    assert {c.version for c in replica.store.all_chunks()} == {2}

    # The partition moves to the replica: version 3 brings back version 1's text, whose
    # vectors it received, so it embeds nothing.
    replica.take_outgoing()
    replica.index(KbChange(op="upsert", doc_id="guide.md", version=3, text=V1))
    out, embedded = replica.take_outgoing()
    assert embedded == 0 and out
    # ...and the old owner, now a replica, takes version 3 from it.
    ship_back = owner.apply_replicated([decode_record(r.key, r.value, list(r.headers))
                                        for r in out])
    assert ship_back["written"] > 0
    assert refs(owner, question) == refs(replica, question)
    assert owner.indexed_versions() == {("default", "guide.md"): 3}
    owner.close()
    replica.close()
