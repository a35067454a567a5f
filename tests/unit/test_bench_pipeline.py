"""The pipeline benchmark's edit choice and figures (pure parts; the run is an integration)."""

from __future__ import annotations

import pytest

from rag.chunking import chunk_document
from ragwarm.bench.pipeline import edit_inside, held, stage_figures, warm_chunk_edit
from schemas import ChunkRef, KbChange, WorkerEvent


class Words:
    """A tokenizer of whitespace words: enough for chunking tests."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [len(w) for w in text.split()]


class Chunker:
    def chunk_hashes(self, doc_id: str, text: str) -> dict[str, str]:
        return {c.chunk_id: c.content_hash for c in chunks(doc_id, text)}


def chunks(doc_id: str, text: str):
    return chunk_document(doc_id, text, Words(), max_tokens=40)


# The repeated line appears first in section A: editing its first occurrence changes A's
# chunk, not B's. That is how the default run's edit 8 changed no warm chunk.
REPEATED = "Run the sync again with the same revision to confirm it."
DOC = (
    f"## A\n\n{REPEATED}\n\nSome words about section A only.\n\n"
    f"## B\n\n{REPEATED}\n\nThis paragraph belongs to section B and nothing else."
)


def test_the_edit_changes_the_warm_chunk_not_an_earlier_copy_of_its_line() -> None:
    b = next(c for c in chunks("d.md", DOC) if c.text.startswith("## B"))
    latest = {"d.md": KbChange(op="upsert", doc_id="d.md", version=1, text=DOC)}
    naive = edit_inside(DOC, b.text, 7)  # the first line of B that is also in the document
    assert Chunker().chunk_hashes("d.md", naive or "")[b.chunk_id] == b.content_hash
    rows = [{"chunk_id": b.chunk_id, "content_hash": b.content_hash, "text": b.text}]
    edit = warm_chunk_edit(Chunker(), latest, [b.ref], rows, 7)
    assert edit is not None and edit[1] == b.ref
    after = Chunker().chunk_hashes("d.md", edit[0].text or "")
    assert after[b.chunk_id] != b.content_hash


def test_no_edit_when_no_warm_chunk_is_retrieved() -> None:
    latest = {"d.md": KbChange(op="upsert", doc_id="d.md", version=1, text=DOC)}
    ref = ChunkRef(chunk_id="d.md#1", content_hash="0" * 64)
    assert warm_chunk_edit(Chunker(), latest, [ref], [], 0) is None


def test_stage_figures() -> None:
    stages = [{"indexed": 10.0, "sent": 20.0, "warm": 30.0}] * 3
    figures = stage_figures(stages)
    assert figures["event_to_indexed_ms_p50"] == pytest.approx(10.0)
    assert figures["event_to_commands_ms_p99"] == pytest.approx(20.0)
    assert figures["event_to_warm_ms_p99"] == pytest.approx(30.0)
    assert stage_figures([])["event_to_warm_ms_p50"] is None


def test_the_kb_split_accounts_for_every_second_of_every_instance():
    from ragwarm.bench.pipeline import kb_split

    counters = {"embed_ms": 60_000, "kb_index_ms": 70_000, "kb_batch_ms": 75_000,
                "embedded_chunks": 600}
    split = kb_split(counters, kb_seconds=50.0, instances=2)
    assert split == {"kb_seconds": 50.0, "kb_embed_s": 60.0, "kb_index_other_s": 10.0,
                     "kb_apply_s": 5.0, "kb_outside_batches_s": 25.0,
                     "app_embed_chunks_per_s": 10.0}
    parts = ("kb_embed_s", "kb_index_other_s", "kb_apply_s", "kb_outside_batches_s")
    assert sum(split[k] for k in parts) == 2 * split["kb_seconds"]


def test_the_timed_embedder_counts_time_and_texts():
    from collections import Counter

    import numpy as np

    from ragwarm.rag_port import TimedEmbedder

    class Inner:
        dim = 3

        def embed(self, texts, progress=None):
            return np.zeros((len(texts), 3))

    stats: Counter = Counter()
    timed = TimedEmbedder(Inner(), stats)  # type: ignore[arg-type]
    assert timed.embed(["a", "b"]).shape == (2, 3) and timed.dim == 3
    assert stats["embedded_chunks"] == 2 and stats["embed_ms"] >= 0


P, Q = "a" * 32, "b" * 32


def test_a_prefix_is_held_while_the_workers_last_word_on_it_is_stored() -> None:
    def said(*kinds: str) -> list[WorkerEvent]:
        return [WorkerEvent(kind=k, worker_id="w1", prefix_hash=P) for k in kinds]

    # Edits 3 and 8 of the default run edited the refs of a prefix that an edit made for
    # another question had invalidated: the edit is now chosen from a prefix held now.
    assert held(P, said("stored"))
    assert not held(P, said("stored", "invalidated"))
    assert held(P, said("stored", "invalidated", "stored", "heartbeat"))
    assert not held(P, said("evicted")) and not held(Q, said("stored"))
