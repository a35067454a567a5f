"""Question tails after a prefix's prefill (pure: no I/O)."""

from __future__ import annotations

import itertools

from schemas import ChunkRef, WarmupCommand
from streams.handle.tails import question_prefills

REFS = [ChunkRef(chunk_id="d.md#0", content_hash="1" * 64)]


def command(op: str, **kw) -> WarmupCommand:
    base = dict(command_id="c0", op=op, prefix_hash="a" * 32, tenant="t", reason="edit")
    if op == "prefill":
        base |= dict(worker_id="w1", token_ids=[7] * 32, chunk_refs=REFS, ttl_s=60.0, pin=True)
    return WarmupCommand(**(base | kw))


def test_each_prefill_gets_one_tail_per_question_in_order_and_nothing_else_does():
    ids = (f"c{i}" for i in itertools.count(1))
    release, prefill = command("release"), command("prefill")
    out = question_prefills([release, prefill], {"q1": [1] * 17, "q2": [], "q3": [3] * 5},
                            lambda: next(ids))
    # A question with no tokens after the prefix (a log without prompts) adds nothing.
    assert [c.token_ids for c in out] == [[7] * 32 + [1] * 17, [7] * 32 + [3] * 5]
    for tail in out:
        assert not tail.pin and tail.ttl_s == 60.0 and tail.chunk_refs == REFS
        assert tail.worker_id == "w1" and tail.prefix_hash == prefill.prefix_hash
        assert tail.reason == "edit: an asked question"
    assert [c.command_id for c in out] == ["c1", "c2"]


def test_no_questions_no_tails():
    prefill = command("prefill")
    assert question_prefills([prefill], {}, lambda: "x") == []
