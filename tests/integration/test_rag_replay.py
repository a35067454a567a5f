"""Replaying the whole Argo CD trace leaves exactly the chunks of the final documents.

One replay (the slow part: every new chunk hash is embedded on CPU) is shared by the tests
of this module. The from-scratch ingest of the final state goes to a second tenant of the
same store, so its vectors are reused across tenants and the comparison costs no embedding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rag.index import Indexer, IndexResult
from rag.retrieve import Retriever
from rag.settings import QdrantSettings
from rag.store import ChunkStore
from ragwarm.models import fetch_llm, load_embedder, load_tokenizer
from ragwarm.settings import TRACE_DIR
from ragwarm.trace import TraceEvent, final_state, read_events, read_questions, split_initial

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(3600),
]


@dataclass
class Replayed:
    store: ChunkStore
    indexer: Indexer
    events: list[TraceEvent]
    initial: list[IndexResult]
    rest: list[IndexResult]
    scratch_embedded: int


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replayed]:
    tokenizer: Any = load_tokenizer(fetch_llm())
    embedder = load_embedder()
    events = list(read_events(TRACE_DIR / "events.jsonl"))
    split = split_initial(events)
    path = tmp_path_factory.mktemp("replay") / "qdrant"
    with ChunkStore.open(QdrantSettings(path=path), "replay", embedder.dim) as store:
        indexer = Indexer(store, embedder, tokenizer)
        initial = indexer.index_documents([e.to_change("replay") for e in split.initial])
        rest = [indexer.index_document(e.to_change("replay")) for e in split.rest]
        before = embedder.computed
        indexer.index_documents([e.to_change("scratch") for e in final_state(events).values()])
        yield Replayed(store, indexer, events, initial, rest, embedder.computed - before)


def _state(store: ChunkStore, tenant: str) -> set[tuple[str, str, int]]:
    return {(s.chunk.chunk_id, s.chunk.content_hash, s.version) for s in store.all_chunks(tenant)}


def test_replay_leaves_exactly_the_chunks_of_a_from_scratch_ingest(replayed: Replayed) -> None:
    replay, scratch = _state(replayed.store, "replay"), _state(replayed.store, "scratch")
    assert replay == scratch
    final = final_state(replayed.events)
    assert {cid.rpartition("#")[0] for cid, _, _ in replay} <= set(final)
    assert replayed.store.count("replay") == len(replay) > 1000
    for doc_id, event in final.items():
        assert replayed.store.doc_version(doc_id, "replay") == event.seq


def test_the_final_state_ingest_reused_every_vector(replayed: Replayed) -> None:
    assert replayed.scratch_embedded == 0


def test_every_change_was_applied_in_order(replayed: Replayed) -> None:
    assert all(r.applied for r in replayed.initial + replayed.rest)
    assert len(replayed.initial) + len(replayed.rest) == len(replayed.events) == 1440


def test_deleted_documents_have_no_chunks(replayed: Replayed) -> None:
    final = final_state(replayed.events)
    deletes = [e for e in replayed.events if e.op == "delete" and e.doc_id not in final]
    assert deletes
    for event in deletes:
        assert replayed.store.current_chunks(event.doc_id, "replay") == []
        assert replayed.store.doc_version(event.doc_id, "replay") == event.seq


def test_unchanged_text_upserts_only_extend(replayed: Replayed) -> None:
    same = [
        r
        for e, r in zip(replayed.events[len(replayed.initial) :], replayed.rest, strict=True)
        if e.metadata.get("text_changed") is False
    ]
    assert same and all(not r.content_changed and r.embedded == 0 for r in same)


def test_replay_embeds_far_fewer_chunks_than_a_naive_re_embed(replayed: Replayed) -> None:
    computed = sum(r.embedded for r in replayed.rest)
    naive = sum(len(r.chunks) for r in replayed.rest if r.op == "upsert")
    assert 0 < computed < naive / 3


def test_replaying_the_trace_again_changes_nothing(replayed: Replayed) -> None:
    before = _state(replayed.store, "replay")
    computed = replayed.indexer.embedder.computed
    tail = replayed.events[-300:]
    again = replayed.indexer.index_documents([e.to_change("replay") for e in tail])
    newest = {e.doc_id: e.seq for e in replayed.events}
    for event, result in zip(tail, again, strict=True):
        # Older versions are refused; the newest one re-applies without a content change.
        assert result.applied == (event.seq == newest[event.doc_id])
        assert not result.content_changed
    assert _state(replayed.store, "replay") == before
    assert replayed.indexer.embedder.computed == computed


def test_retrieval_finds_the_answering_document_for_most_questions(replayed: Replayed) -> None:
    last = replayed.events[-1].seq
    questions = [q for q in read_questions(TRACE_DIR / "questions.jsonl") if q.live_at(last)]
    retriever = Retriever(replayed.store, replayed.indexer.embedder)
    found = retriever.retrieve_many([q.question for q in questions], tenant="replay")
    hits = sum(bool(q.answer_docs & set(r.doc_ids)) for q, r in zip(questions, found, strict=True))
    assert hits / len(questions) >= 0.6
