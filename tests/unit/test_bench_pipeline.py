"""The pipeline benchmark's edit choice and figures (pure parts; the run is an integration)."""

from __future__ import annotations

import pytest

from rag.chunking import chunk_document
from ragwarm.bench.pipeline_edits import edit_inside, stage_figures, warm_chunk_edit
from schemas import ChunkRef, KbChange


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
                "replica_publish_ms": 3_000, "chunks_embedded": 600}
    split = kb_split(counters, kb_seconds=50.0, instances=2)
    assert split == {"kb_seconds": 50.0, "kb_embed_s": 60.0, "kb_index_other_s": 7.0,
                     "kb_publish_s": 3.0, "kb_apply_s": 5.0, "kb_outside_batches_s": 25.0,
                     "app_embed_chunks_per_s": 10.0}
    parts = ("kb_embed_s", "kb_index_other_s", "kb_publish_s", "kb_apply_s",
             "kb_outside_batches_s")
    assert sum(split[k] for k in parts) == 2 * split["kb_seconds"]


def test_instances_are_timed_together_once_each_holds_its_share_of_the_partitions():
    from ragwarm.bench.pipeline import spread_over, summed

    def bodies(*shares: float) -> list[dict]:
        return [{"counters": {"queries": 10}, "owned_share": s} for s in shares]

    assert spread_over(bodies(1.0))
    assert not spread_over(bodies(1.0, 0.0))  # the second has not joined yet
    assert not spread_over(bodies(1.0, 0.5))  # a rebalance under way: the first's old share
    assert spread_over(bodies(0.5, 0.5))
    assert spread_over(bodies(0.75, 0.25))
    assert not spread_over([{"counters": {}}])  # an app without the field never counts
    assert summed(bodies(0.5, 0.5)) == {"queries": 20}


def test_the_timed_embedder_counts_its_time():
    from collections import Counter

    import numpy as np

    from ragwarm.rag_port import TimedEmbedder

    class Inner:
        dim = 3

        def embed(self, texts, progress=None):
            return np.zeros((len(texts), 3))

    stats: Counter = Counter()
    timed = TimedEmbedder(Inner(), stats)
    assert timed.embed(["a", "b"]).shape == (2, 3) and timed.dim == 3
    # The texts are counted once, by the replica's publish (`chunks_embedded`), not here.
    assert stats["embed_ms"] >= 0 and set(stats) == {"embed_ms"}


def _cmd(op: str, prefix_hash: str, refs=(), reason: str = "hot"):
    from schemas import WarmupCommand

    return WarmupCommand(command_id="c", op=op, prefix_hash=prefix_hash, tenant="default",
                         chunk_refs=list(refs), token_ids=[1] if op == "prefill" else [],
                         reason=reason)


def _event(kind: str, prefix_hash: str | None, reason: str | None = None, held=()):
    from schemas import WorkerEvent

    return WorkerEvent(worker_id="w", kind=kind, prefix_hash=prefix_hash, reason=reason,
                       warm_prefixes=list(held))


STALE = ChunkRef(chunk_id="d.md#1", content_hash="1" * 64)
OLD, NEW, OTHER = "a" * 64, "b" * 64, "c" * 64


def test_the_stages_of_an_edit_come_from_the_commands_and_events_after_it() -> None:
    from ragwarm.bench.pipeline_edits import stage_times, stored_between

    commands = [
        (99.0, _cmd("invalidate", OLD, [STALE])),  # before the edit: not this one
        (100.5, _cmd("invalidate", OLD, [STALE])),
        (100.7, _cmd("prefill", OTHER)),
        (101.0, _cmd("prefill", NEW)),
    ]
    seen = [(101.5, _event("stored", OTHER)), (103.0, _event("stored", NEW))]
    times = stage_times(commands, seen, 100.0, STALE, NEW)
    assert times == {"indexed": 100.5, "sent": 101.0, "warm": 103.0}
    assert stored_between(seen, 101.0, 103.0, NEW) == 1


def test_a_missed_edit_says_at_which_stage_it_stopped() -> None:
    from ragwarm.bench.pipeline_edits import miss_reason, stage_times

    none = stage_times([], [], 100.0, STALE, NEW)
    assert "no invalidation" in miss_reason(none, [], 100.0, NEW)
    indexed = stage_times([(100.5, _cmd("invalidate", OLD, [STALE]))], [], 100.0, STALE, NEW)
    assert "no prefill of the new prefix" in miss_reason(indexed, [], 100.0, NEW)
    sent = indexed | {"sent": 101.0}
    refused = [(101.2, _event("refused", NEW, "over the budget"))]
    assert "refused the prefill: over the budget" in miss_reason(sent, refused, 100.0, NEW)
    assert "no stored event" in miss_reason(sent, [], 100.0, NEW)


def test_a_missed_edit_keeps_the_commands_about_its_prefix_or_its_chunk() -> None:
    from ragwarm.bench.pipeline_edits import command_trail

    commands = [
        (99.0, _cmd("invalidate", OLD, [STALE])),  # before the edit
        (100.2, _cmd("prefill", OTHER)),  # another prefix, another chunk
        (100.4, _cmd("invalidate", OLD, reason="stale (found by a hot op)")),  # by hash
        (100.6, _cmd("invalidate", OTHER, [STALE], reason="edit")),  # names the chunk
    ]
    assert command_trail(commands, 100.0, 160.0, OLD, STALE) == [
        f"400 ms: invalidate {OLD[:12]} (stale (found by a hot op))",
        f"600 ms: invalidate {OTHER[:12]} (edit)",
    ]


def test_missed_edits_are_counted_and_left_out_of_the_percentiles() -> None:
    outcomes = [{"indexed": 10.0, "sent": 20.0, "warm": 30.0, "missed": None},
                {"indexed": 10.0, "sent": None, "warm": None, "missed": "no prefill"}]
    figures = stage_figures(outcomes)
    assert figures["edits_warm"] == 1 and figures["edits_missed"] == 1
    assert figures["event_to_warm_ms_p99"] == pytest.approx(30.0)


def test_an_edited_document_is_edited_again_only_when_no_other_can_be() -> None:
    other = "## C\n\nA long enough line of another document to edit here.\n"
    a = next(c for c in chunks("d.md", DOC) if c.text.startswith("## B"))
    c = chunks("e.md", other)[0]
    latest = {"d.md": KbChange(op="upsert", doc_id="d.md", version=1, text=DOC),
              "e.md": KbChange(op="upsert", doc_id="e.md", version=1, text=other)}
    rows = [{"chunk_id": x.chunk_id, "content_hash": x.content_hash, "text": x.text}
            for x in (a, c)]
    held = [a.ref, c.ref]
    assert warm_chunk_edit(Chunker(), latest, held, rows, 1)[1] == a.ref
    assert warm_chunk_edit(Chunker(), latest, held, rows, 1, {"d.md"})[1] == c.ref
    assert warm_chunk_edit(Chunker(), latest, [a.ref], rows, 1, {"d.md"})[1] == a.ref


def test_an_edit_whose_question_now_retrieves_a_prefix_already_held_is_warm_at_once() -> None:
    from ragwarm.bench.pipeline_edits import stage_times

    commands = [(100.5, _cmd("invalidate", OLD, [STALE]))]
    seen = [(99.0, _event("stored", NEW)),  # held before the edit: no new `stored` event
            (100.2, _event("heartbeat", None, held=[OLD, NEW])),  # before the indexing
            (101.2, _event("heartbeat", None, held=[NEW]))]
    times = stage_times(commands, seen, 100.0, STALE, NEW)
    assert times == {"indexed": 100.5, "sent": None, "warm": 101.2}


def test_a_question_re_prefilled_by_another_edit_is_followed_to_its_new_prefix() -> None:
    from types import SimpleNamespace

    from ragwarm.bench.pipeline_edits import EditRun

    stored = {"new-q1": [STALE]}  # the worker's `stored` events, by prefix hash
    now = {"q1": "new-q1", "q2": "new-q2"}  # what each question retrieves now

    class Prompts:
        def query_event(self, question: str):
            event = SimpleNamespace(prefix_hash=now[question], chunk_refs=[STALE])
            return event, [f"rows of {question}"]

    b = SimpleNamespace(stored_refs=lambda h: stored.get(h, []))
    run = EditRun(b, Prompts(), {})
    run.warm = [("q1", "old-q1"), ("q2", "old-q2")]

    assert run.refresh(0) == ["rows of q1"]
    assert run.warm[0] == ("q1", "new-q1")  # the worker stored it: that is what it holds
    run.refresh(1)
    assert run.warm[1] == ("q2", "old-q2")  # never stored: the record stays
