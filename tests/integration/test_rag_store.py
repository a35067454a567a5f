"""Indexing into real Qdrant local mode with the real embedder and the SmolLM2 tokenizer."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag.embed import Embedder
from rag.index import Indexer
from rag.prompt import PromptBuilder
from rag.retrieve import Retriever
from rag.settings import QdrantSettings
from rag.store import ChunkStore, StoreError, open_client
from schemas import KbChange
from tests.integration.rag_kit import V1, section

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tmp_path: Path, embedder: Embedder) -> Iterator[ChunkStore]:
    with ChunkStore.open(QdrantSettings(path=tmp_path / "qdrant"), "test", embedder.dim) as s:
        yield s


@pytest.fixture
def indexer(store: ChunkStore, embedder: Embedder, tokenizer: Any) -> Indexer:
    return Indexer(store, embedder, tokenizer, chunk_tokens=128)


def _upsert(version: int, text: str, doc: str = "guide.md", tenant: str = "default") -> KbChange:
    return KbChange(op="upsert", doc_id=doc, version=version, text=text, tenant=tenant)


def _delete(version: int, doc: str = "guide.md") -> KbChange:
    return KbChange(op="delete", doc_id=doc, version=version)


def _stored(store: ChunkStore, doc: str = "guide.md") -> list[tuple[str, str, int]]:
    return [(s.chunk.chunk_id, s.chunk.content_hash, s.version) for s in store.current_chunks(doc)]


def test_first_upsert_stores_every_chunk(indexer: Indexer, store: ChunkStore) -> None:
    result = indexer.index_document(_upsert(1, V1))
    assert result.applied and result.previous_version is None
    assert result.added == result.new_refs and not result.old_refs
    assert result.embedded == len({c.content_hash for c in result.chunks}) > 3
    assert _stored(store) == [(c.chunk_id, c.content_hash, 1) for c in result.chunks]
    assert store.doc_version("guide.md") == 1 and store.count() == len(result.chunks)


def test_an_edit_replaces_the_chunk_set_and_embeds_only_new_hashes(
    indexer: Indexer, store: ChunkStore, embedder: Embedder
) -> None:
    first = indexer.index_document(_upsert(1, V1))
    v2 = V1.replace("sync wave detail number 3 ", "sync wave detail number three ")
    v2 = v2.replace(section("Projects", "project"), "")
    before = embedder.computed
    second = indexer.index_document(_upsert(2, v2))
    assert second.applied and second.previous_version == 1
    assert second.old_refs == first.new_refs
    assert len(second.changed) == 1 and second.removed and not second.added
    assert embedder.computed - before == second.embedded == 1
    assert _stored(store) == [(c.chunk_id, c.content_hash, 2) for c in second.chunks]
    assert store.count() == len(second.chunks)


def test_moved_chunks_reuse_their_vectors(indexer: Indexer, embedder: Embedder) -> None:
    indexer.index_document(_upsert(1, V1))
    inserted = section("Caveats", "caveat", 5) + "\n\n## Sync waves"
    moved = V1.replace("## Sync waves", inserted)
    before = embedder.computed
    result = indexer.index_document(_upsert(2, moved))
    assert result.added  # ordinals shifted: ids moved to other texts
    assert embedder.computed - before == result.embedded == 1


def test_identical_reingest_is_applied_but_unchanged(
    indexer: Indexer, store: ChunkStore, embedder: Embedder
) -> None:
    first = indexer.index_document(_upsert(1, V1))
    before = embedder.computed
    again = indexer.index_document(_upsert(3, V1))
    assert again.applied and not again.content_changed
    assert again.unchanged == first.new_refs and again.embedded == 0
    assert embedder.computed == before
    assert {v for _, _, v in _stored(store)} == {3}


def test_an_older_version_never_overwrites_a_newer_one(indexer: Indexer, store: ChunkStore) -> None:
    indexer.index_document(_upsert(5, V1))
    snapshot = _stored(store)
    stale = indexer.index_document(_upsert(4, "# Old\n\nolder text"))
    assert not stale.applied and not stale.content_changed
    assert stale.previous_version == 5 and stale.new_refs == stale.old_refs
    assert _stored(store) == snapshot and store.doc_version("guide.md") == 5


def test_delete_removes_every_chunk_and_keeps_its_version(
    indexer: Indexer, store: ChunkStore
) -> None:
    indexer.index_document(_upsert(1, V1))
    indexer.index_document(_upsert(1, "# Other", doc="other.md"))
    gone = indexer.index_document(_delete(2))
    assert gone.applied and gone.removed == gone.old_refs and not gone.new_refs
    assert _stored(store) == [] and store.doc_version("guide.md") == 2
    assert not indexer.index_document(_upsert(1, V1)).applied
    assert indexer.index_document(_upsert(3, V1)).applied
    assert len(_stored(store, "other.md")) == 1


def test_batched_changes_equal_one_by_one(
    indexer: Indexer, store: ChunkStore, tokenizer: Any, embedder: Embedder, tmp_path: Path
) -> None:
    changes = [_upsert(1, V1), _upsert(2, V1 + "\n\nMore."), _upsert(1, V1, doc="copy.md")]
    batched = indexer.index_documents(changes)
    assert [r.applied for r in batched] == [True, True, True]
    assert batched[2].embedded == 0  # same texts as guide.md: vectors reused
    with ChunkStore.open(QdrantSettings(path=tmp_path / "other"), "test", embedder.dim) as other:
        single = Indexer(other, embedder, tokenizer, chunk_tokens=128)
        for change in changes:
            single.index_document(change)
        assert sorted(_stored(other)) == sorted(_stored(store))
        assert sorted(_stored(other, "copy.md")) == sorted(_stored(store, "copy.md"))


def test_search_get_chunks_and_tenants(
    indexer: Indexer, store: ChunkStore, embedder: Embedder
) -> None:
    indexer.index_document(_upsert(1, V1))
    indexer.index_document(
        _upsert(1, section("Secrets", "vault secret"), doc="t2.md", tenant="t2")
    )
    retriever = Retriever(store, embedder)
    hits = retriever.retrieve("How are sync waves ordered?", tenant="default")
    assert len(hits.hits) == 3 and hits.doc_ids == ["guide.md"]
    assert "sync wave" in hits.hits[0].chunk.text
    scores = [h.score for h in hits.hits]
    assert scores == sorted(scores, reverse=True)
    only_t2 = retriever.retrieve("How are sync waves ordered?", tenant="t2")
    assert {h.tenant for h in only_t2.hits} == {"t2"}
    embedded = embedder.computed
    assert retriever.retrieve("sync waves", tenant="nobody").hits == ()
    assert embedder.computed == embedded  # a tenant the local store never held: no pass
    assert store.tenants() == {"default", "t2"}
    anywhere = retriever.retrieve("vault secret behaviour", k=1)
    assert anywhere.hits[0].chunk.doc_id == "t2.md"
    wanted = [r.chunk_id for r in hits.refs] + ["guide.md#999"]
    got = store.get_chunks(wanted)
    assert set(got) == {r.chunk_id for r in hits.refs}
    assert store.get_chunks([r.chunk_id for r in hits.refs], tenant="t2") == {}


def test_the_store_survives_a_reopen(tmp_path: Path, embedder: Embedder, tokenizer: Any) -> None:
    settings = QdrantSettings(path=tmp_path / "q")
    with ChunkStore.open(settings, "test", embedder.dim) as store:
        Indexer(store, embedder, tokenizer).index_document(_upsert(7, V1))
        refs = _stored(store)
    with ChunkStore.open(settings, "test", embedder.dim) as store:
        assert _stored(store) == refs and store.doc_version("guide.md") == 7
    with pytest.raises(StoreError, match="dimensional"):
        ChunkStore.open(settings, "test", embedder.dim + 1)


def test_a_second_opener_of_a_local_store_is_told_who_owns_it(
    store: ChunkStore, tmp_path: Path
) -> None:
    with pytest.raises(StoreError, match="RAGWARM_QDRANT_URL"):
        open_client(QdrantSettings(path=tmp_path / "qdrant"))


def test_real_tokenizer_prefix_is_identical_in_any_score_order(
    indexer: Indexer, store: ChunkStore, embedder: Embedder, tokenizer: Any
) -> None:
    indexer.index_document(_upsert(1, V1))
    hits = Retriever(store, embedder).retrieve("What do projects restrict?").chunks
    builder = PromptBuilder(tokenizer)
    prompts = [
        builder.build(list(p), "What do projects restrict?") for p in itertools.permutations(hits)
    ]
    prefixes = {bytes(str(p.prefix_ids), "ascii") for p in prompts}
    assert len(prefixes) == 1
    prompt = prompts[0]
    assert list(prompt.prefix_ids) == builder.build_prefix(hits)
    assert tokenizer.decode(list(prompt.token_ids)) == prompt.text
    assert tokenizer.decode(list(prompt.prefix_ids)) == prompt.prefix_text
    assert prompt.prefix_text.startswith("<|im_start|>system\n")
    assert prompt.prefix_text.endswith("<|im_start|>user\n")
    # The same chunks read back by id (as warmup does from refs) give the same prefix.
    again = store.get_chunks([r.chunk_id for r in prompt.chunk_refs])
    assert builder.build_prefix([s.chunk for s in again.values()]) == list(prompt.prefix_ids)


def _journal_modes(path: Path) -> set[str]:
    import sqlite3

    modes = set()
    for db in path.rglob("storage.sqlite"):
        with sqlite3.connect(db) as conn:
            modes.add(conn.execute("PRAGMA journal_mode").fetchone()[0])
    return modes


@pytest.mark.parametrize("sync, mode", [("normal", "wal"), ("full", "delete")])
def test_local_commits_go_to_a_write_ahead_log_unless_told_to_sync(
    tmp_path: Path, sync: str, mode: str
) -> None:
    """The local store's collections commit to a write-ahead log by default (each point is
    its own transaction; syncing each was half the indexer's time outside embedding), and
    what was written is there after a reopen."""
    from rag.chunking import Chunk, content_hash
    from rag.store import DocRecord, DocWrite

    settings = QdrantSettings(path=tmp_path / "q", local_sync=sync)
    chunk = Chunk("a.md", 0, "some text", content_hash("some text"), 3)
    with ChunkStore.open(settings, "walled", 4) as store:
        store.write_document(DocWrite(DocRecord("a.md", "default", 7, False, 1), [chunk],
                                      [np.array([1.0, 0.0, 0.0, 0.0])]))
    assert _journal_modes(tmp_path / "q") == {mode}
    with ChunkStore.open(settings, "walled", 4) as store:
        assert store.doc_version("a.md") == 7
        assert [s.chunk.content_hash for s in store.current_chunks("a.md")] == [chunk.content_hash]
