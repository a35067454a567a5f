"""Event-driven chunk warmup: which chunk KV a KB change computes and which it drops."""

from __future__ import annotations

from schemas import ChunkRef, KbChange
from streams.decide.chunks import (
    Retrieval,
    WarmedChunks,
    asked_in_window,
    changed_chunks,
    plan_chunk_warmup,
    rank_new_chunks,
    rank_window_chunks,
    retrieval_counts,
)
from streams.decide.records import DocState

H = {n: f"{n:x}" * 16 for n in range(1, 8)}
OPENING = [1, 2, 3]


def change(version: int, op: str = "upsert") -> KbChange:
    text = "x" if op == "upsert" else None
    return KbChange(op=op, doc_id="doc", version=version, tenant="t", text=text)


def plan(prior: DocState | None, new: dict[str, str], **kw: object) -> list:
    args = {"tracked": True, "opening_ids": OPENING, "ttl_s": 60.0, "budget": 10,
            "command_ids": [f"c{i}" for i in range(20)],
            "chunk_tokens": {c: [10 + i] * 20 for i, c in enumerate(new)},
            "retrieved": {c: Retrieval(1, 1.0) for c in new}} | kw
    return plan_chunk_warmup(change(2), prior, new, **args)  # type: ignore[arg-type]


def test_an_edit_prefills_the_new_versions_and_drops_the_replaced_ones() -> None:
    prior = DocState(version=1, tenant="t", chunks={"doc#0": H[1], "doc#1": H[2], "doc#2": H[3]})
    new = {"doc#0": H[1], "doc#1": H[4], "doc#3": H[5]}  # #1 edited, #2 gone, #3 added
    commands = plan(prior, new)
    assert commands[0].op == "invalidate"
    assert commands[0].chunk_refs == [ChunkRef(chunk_id="doc#1", content_hash=H[2]),
                                      ChunkRef(chunk_id="doc#2", content_hash=H[3])]
    prefills = commands[1:]
    assert [c.op for c in prefills] == ["prefill_chunk"] * 2
    assert [c.chunk_refs[0].chunk_id for c in prefills] == ["doc#1", "doc#3"]
    assert prefills[0].chunk_refs[0].content_hash == H[4]  # the new version, never the old
    assert all(c.opening_ids == OPENING and c.token_ids for c in prefills)
    assert len({c.command_id for c in commands}) == len(commands)


def test_an_untracked_document_only_drops_replaced_chunk_kv() -> None:
    prior = DocState(version=1, tenant="t", chunks={"doc#0": H[1]})
    commands = plan(prior, {"doc#0": H[2]}, tracked=False)
    assert [c.op for c in commands] == ["invalidate"]


def test_the_budget_caps_prefills_in_retrieval_order() -> None:
    new = {f"doc#{i}": H[1 + i % 7] for i in (10, 2, 0)}
    retrieved = {"doc#2": Retrieval(1, 9.0), "doc#10": Retrieval(3, 3.0), "doc#0": Retrieval()}
    commands = plan(None, new, budget=2, retrieved=retrieved)
    assert [c.chunk_refs[0].chunk_id for c in commands] == ["doc#10", "doc#2"]


def test_new_chunks_nobody_retrieves_are_not_warmed() -> None:
    commands = plan(None, {"doc#0": H[1], "doc#7": H[2]}, retrieved={"doc#9": Retrieval(1, 1)})
    assert commands == []


def ref(chunk_id: str, n: int = 1) -> ChunkRef:
    return ChunkRef(chunk_id=chunk_id, content_hash=H[n])


def test_new_versions_of_retrieved_chunks_come_first_then_their_neighbours() -> None:
    retrieved = retrieval_counts([
        ([ref("a#3"), ref("b#0")], 5.0),  # one question asked five times
        ([ref("b#0"), ref("c#1")], 1.0),
        ([ref("a#3"), ref("c#1")], 1.0),
    ])
    assert retrieved["a#3"] == Retrieval(2, 6.0) and retrieved["b#0"] == Retrieval(2, 6.0)
    assert retrieved["c#1"] == Retrieval(2, 2.0)
    # An edit of document a: a#3 changed, a#4 (after it) and a#9 are new or changed too.
    new = [ref("a#4", 2), ref("a#9", 2), ref("a#3", 2)]
    assert [r.chunk_id for r in rank_new_chunks(new, retrieved)] == ["a#3", "a#4"]
    # Distinct prompts outrank asks: one question repeated is weaker evidence.
    counts = {"d#0": Retrieval(1, 50.0), "d#5": Retrieval(3, 3.0)}
    assert [r.chunk_id for r in rank_new_chunks([ref("d#0"), ref("d#5")], counts)] == [
        "d#5", "d#0"]


def test_window_chunks_rank_by_retrieval_without_the_openers_of_kept_prefixes() -> None:
    asked = [([ref("a#0"), ref("b#1")], 4.0), ([ref("a#0"), ref("c#2")], 1.0),
             ([ref("b#1"), ref("c#2"), ref("d#3")], 1.0)]
    ranked = rank_window_chunks(asked)
    # d#3: one prompt retrieved it, whose own prefix is the better use of the memory.
    assert [r.chunk_id for r in ranked] == ["a#0", "b#1", "c#2"]
    # a#0 opens a kept prefix: `system + a#0` is held already.
    assert [r.chunk_id for r in rank_window_chunks(asked, [ref("a#0")])] == ["b#1", "c#2"]
    # Another version of a#0 is still worth warming.
    assert "a#0" in [r.chunk_id for r in rank_window_chunks(asked, [ref("a#0", 2)])]


def test_a_document_the_window_keeps_retrieving_counts_as_hot() -> None:
    # Asked three times together: hot at a threshold of 2 (between an invalidation and
    # the next hot tick, the hot set does not name it).
    retrieved = retrieval_counts([([ref("a#3"), ref("b#0")], 2.0), ([ref("a#1")], 1.0)])
    assert asked_in_window(retrieved, "a", 2.0)
    assert not asked_in_window(retrieved, "a", 4.0)
    # b#0 only by a prompt asked twice: hot at 2, not at 3; another document never.
    assert asked_in_window(retrieved, "b", 2.0) and not asked_in_window(retrieved, "b", 3.0)
    assert not asked_in_window(retrieved, "c", 0.5)


def test_warmed_chunks_are_due_again_after_their_ttl() -> None:
    warmed = WarmedChunks()
    warmed.mark("t", [ref("a#0")], 100.0, 60.0)
    assert warmed.due("t", [ref("a#0"), ref("a#1")], 130.0, 60.0) == [ref("a#1")]
    assert warmed.due("u", [ref("a#0")], 130.0, 60.0) == [ref("a#0")]  # another tenant
    assert warmed.due("t", [ref("a#0")], 160.0, 60.0) == [ref("a#0")]
    warmed.mark("t", [ref("b#0")], 200.0, 60.0)
    assert set(warmed.sent) == {("t", "b#0", H[1])}  # past their TTL: forgotten


def test_a_stale_change_plans_nothing() -> None:
    prior = DocState(version=5, tenant="t", chunks={"doc#0": H[1]})
    assert plan(prior, {"doc#0": H[2]}) == []


def test_a_delete_drops_every_chunk() -> None:
    prior = DocState(version=1, tenant="t", chunks={"doc#0": H[1], "doc#1": H[2]})
    new, old = changed_chunks(prior, {})
    assert new == [] and [r.chunk_id for r in old] == ["doc#0", "doc#1"]
