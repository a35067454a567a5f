"""Event-driven chunk warmup: which chunk KV a KB change computes and which it drops."""

from __future__ import annotations

from schemas import ChunkRef, KbChange
from streams.chunks import changed_chunks, plan_chunk_warmup
from streams.records import DocState

H = {n: f"{n:x}" * 16 for n in range(1, 8)}
OPENING = [1, 2, 3]


def change(version: int, op: str = "upsert") -> KbChange:
    text = "x" if op == "upsert" else None
    return KbChange(op=op, doc_id="doc", version=version, tenant="t", text=text)


def plan(prior: DocState | None, new: dict[str, str], **kw: object) -> list:
    args = {"tracked": True, "opening_ids": OPENING, "ttl_s": 60.0, "budget": 10,
            "command_ids": [f"c{i}" for i in range(20)],
            "chunk_tokens": {c: [10 + i] * 20 for i, c in enumerate(new)}} | kw
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


def test_the_budget_caps_prefills_in_document_order() -> None:
    new = {f"doc#{i}": H[1 + i % 7] for i in (10, 2, 0)}
    commands = plan(None, new, budget=2)
    assert [c.chunk_refs[0].chunk_id for c in commands] == ["doc#0", "doc#2"]


def test_a_stale_change_plans_nothing() -> None:
    prior = DocState(version=5, tenant="t", chunks={"doc#0": H[1]})
    assert plan(prior, {"doc#0": H[2]}) == []


def test_a_delete_drops_every_chunk() -> None:
    prior = DocState(version=1, tenant="t", chunks={"doc#0": H[1], "doc#1": H[2]})
    new, old = changed_chunks(prior, {})
    assert new == [] and [r.chunk_id for r in old] == ["doc#0", "doc#1"]
