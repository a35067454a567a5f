"""Event-driven chunk warmup in the streams handlers: dict tables, an in-memory outbox."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import ChunkRef, KbChange, WorkerEvent
from streams.decide.chunks import plan_ready_chunks, within_budget
from streams.decide.hot import HotPayload
from streams.decide.records import DocState, PrefixOp, doc_key
from streams.handle import handlers
from streams.sim import run_sync
from tests.unit.conftest import Port, pipeline

OLD, NEW = "1" * 64, "2" * 64
OPENING = [5, 6, 7]


class ChunkPort(Port):
    """The handlers' test port, with chunk tokens for the current chunks."""

    def chunk_tokens(self, refs: Sequence[ChunkRef], tenant: str) -> dict[str, list[int]]:
        return {r.chunk_id: [9] * 20 for r in refs
                if self.current.get((tenant, r.chunk_id)) == r.content_hash}

    def opening_ids(self) -> list[int]:
        return OPENING


def edited(port: ChunkPort, *, linked: bool, **settings):
    """A KB change replacing d.md#0 (OLD -> NEW); with `linked`, a tracked prefix uses it."""
    p, out = pipeline(port, prefix_ttl_s=60.0, kv_bytes_per_token=1, **settings)
    key = doc_key("default", "d.md")
    p.tables.doc_states[key] = DocState(version=1, chunks={"d.md#0": OLD})
    if linked:
        p.tables.doc_prefixes[key] = {"a" * 64: [{"chunk_id": "d.md#0", "content_hash": OLD}]}
    change = KbChange(op="upsert", doc_id="d.md", version=2, text="new")
    return p, out, change


def test_an_edit_to_a_linked_document_prefills_its_new_chunk_and_drops_the_old_kv():
    port = ChunkPort({("default", "d.md#0"): NEW})
    p, out, change = edited(port, linked=True, chunk_warmup=True)
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": NEW}))
    invalidate, prefill = out.commands
    assert invalidate.op == "invalidate"
    assert invalidate.chunk_refs == [ChunkRef(chunk_id="d.md#0", content_hash=OLD)]
    assert prefill.op == "prefill_chunk" and prefill.worker_id is None  # every worker
    assert prefill.chunk_refs == [ChunkRef(chunk_id="d.md#0", content_hash=NEW)]
    assert prefill.token_ids == [9] * 20 and prefill.opening_ids == OPENING
    assert prefill.expires_at is not None  # a late chunk prefill is skipped like a prefill
    assert not prefill.pin and prefill.ttl_s == p.settings.chunk_ttl_s
    assert (p.stats["chunk_prefills"], p.stats["chunk_invalidations"]) == (1, 1)


def test_chunk_pin_pins_the_chunk_prefills():
    port = ChunkPort({("default", "d.md#0"): NEW})
    p, out, change = edited(port, linked=True, chunk_warmup=True, chunk_pin=True)
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": NEW}))
    assert [c.pin for c in out.commands if c.op == "prefill_chunk"] == [True]


def test_an_edit_to_a_document_nobody_uses_only_drops_the_old_chunk_kv():
    port = ChunkPort({("default", "d.md#0"): NEW})
    p, out, change = edited(port, linked=False, chunk_warmup=True)
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": NEW}))
    assert [c.op for c in out.commands] == ["invalidate"]


def test_a_hot_document_is_warmed_even_without_links():
    port = ChunkPort({("default", "d.md#0"): NEW})
    p, out, change = edited(port, linked=False, chunk_warmup=True)
    refs = [ChunkRef(chunk_id="d.md#0", content_hash=OLD)]
    p.tracker.hot["b" * 64] = PrefixOp(op="warm", prefix_hash="b" * 64, chunk_refs=refs)
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": NEW}))
    assert [c.op for c in out.commands] == ["invalidate", "prefill_chunk"]


def test_chunk_warmup_off_sends_no_chunk_command():
    port = ChunkPort({("default", "d.md#0"): NEW})
    p, out, change = edited(port, linked=True)
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": NEW}))
    assert out.commands == []


def test_the_warm_budget_leaves_chunks_cold_and_counts_them():
    port = ChunkPort({("default", "d.md#0"): NEW})
    # 1,000 bytes of worker memory at 1 byte a token: a 1% share is 10 tokens < 20.
    p, out, change = edited(port, linked=True, chunk_warmup=True, chunk_warm_share=0.01)
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": NEW}))
    assert [c.op for c in out.commands] == ["invalidate"]
    assert p.stats["chunk_warm_over_budget"] == 1


def test_a_ready_worker_gets_the_retrieved_chunks_its_hot_prefixes_do_not_open():
    port = ChunkPort({("default", "d.md#0"): OLD, ("default", "d.md#1"): OLD})
    p, out = pipeline(port, prefix_ttl_s=60.0, kv_bytes_per_token=1, chunk_warmup=True,
                      hot_tokens=False)
    refs = [ChunkRef(chunk_id=f"d.md#{i}", content_hash=OLD) for i in (0, 1)]
    p.tracker.hot["b" * 64] = PrefixOp(op="warm", prefix_hash="b" * 64, chunk_refs=refs)
    p.tracker.observe("b" * 64, HotPayload("default", "q?", tuple(refs), 32), 100.0)
    # A second prompt retrieves both: d.md#1 is shared; d.md#0 still opens the hot prefix.
    p.tracker.observe("f" * 64, HotPayload("default", "q2?", tuple(refs), 32), 100.0)
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w2", kind="ready",
                                                     mem_total_bytes=10_000)))
    chunk = [c for c in out.commands if c.op == "prefill_chunk"]
    # d.md#0 opens the hot prefix, whose re-warm holds `system + d.md#0` already.
    assert [(c.worker_id, c.chunk_refs) for c in chunk] == [("w2", refs[1:])]


def test_the_hot_tick_warms_the_window_chunks_once_within_their_ttl():
    port = ChunkPort({("default", f"d.md#{i}"): OLD for i in range(3)})
    p, out = pipeline(port, prefix_ttl_s=60.0, kv_bytes_per_token=1, chunk_warmup=True,
                      hot_tokens=True, hot_min_count=99)  # nothing becomes hot
    refs = [ChunkRef(chunk_id=f"d.md#{i}", content_hash=OLD) for i in range(3)]
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w1", kind="ready",
                                                     mem_total_bytes=10_000)))
    out.commands.clear()
    now = p.clock()
    p.tracker.observe("c" * 64, HotPayload("default", "q1?", tuple(refs[:2]), 32), now)
    p.tracker.observe("e" * 64, HotPayload("default", "q2?", tuple(refs[1:]), 32), now)
    run_sync(handlers.plan_hot(p))
    sent = [c for c in out.commands if c.op == "prefill_chunk"]
    # d.md#1 is retrieved by both questions, d.md#0 and #2 by one each (their prompts'
    # own prefixes serve them better); to every worker.
    assert [c.chunk_refs[0].chunk_id for c in sent] == ["d.md#1"]
    assert {c.worker_id for c in sent} == {None}
    out.commands.clear()
    run_sync(handlers.plan_hot(p))
    assert not [c for c in out.commands if c.op == "prefill_chunk"]  # sent within the TTL


def test_the_window_chunks_are_a_standing_set_within_the_budget():
    port = ChunkPort({("default", f"d.md#{i}"): OLD for i in range(4)})
    # 1,000 bytes at 1 byte a token, 5%: 50 tokens, two chunks of 20.
    p, out = pipeline(port, prefix_ttl_s=60.0, kv_bytes_per_token=1, chunk_warmup=True,
                      hot_tokens=True, hot_min_count=99, chunk_warm_share=0.05)
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w1", kind="ready",
                                                     mem_total_bytes=1_000)))
    out.commands.clear()
    refs = [ChunkRef(chunk_id=f"d.md#{i}", content_hash=OLD) for i in range(4)]
    for n, pair in enumerate((refs[:2], refs[:2], refs[2:], refs[2:])):
        p.tracker.observe(str(n) * 64, HotPayload("default", f"q{n}?", tuple(pair), 32),
                          p.clock())
    for _ in range(3):  # tick after tick, the same two chunks at most
        run_sync(handlers.plan_hot(p))
    sent = [c.chunk_refs[0].chunk_id for c in out.commands if c.op == "prefill_chunk"]
    assert sent == ["d.md#0", "d.md#1"]


def test_ready_chunks_are_sent_once_each_within_the_budget():
    a, b, c = (ChunkRef(chunk_id=f"d#{i}", content_hash=h * 16) for i, h in enumerate("abc"))
    tokens = {"d#0": [1] * 10, "d#1": [2] * 10, "d#2": [3] * 10}
    commands = plan_ready_chunks(
        [[a, b], [b, c]], tokens, tenant="t", worker_id="w", opening_ids=[1], ttl_s=5.0,
        token_budget=20, command_ids=[str(i) for i in range(6)],
    )
    assert [cmd.chunk_refs[0].chunk_id for cmd in commands] == ["d#0", "d#1"]
    assert plan_ready_chunks([[a]], tokens, tenant="t", worker_id="w", opening_ids=[],
                             ttl_s=5.0, token_budget=99, command_ids=["x"]) == []


def test_within_budget_stops_at_the_first_chunk_that_does_not_fit():
    refs = [ChunkRef(chunk_id=f"d#{i}", content_hash="f" * 16) for i in range(3)]
    tokens = {"d#0": [1] * 5, "d#1": [1] * 50, "d#2": [1] * 5}
    assert [r.chunk_id for r in within_budget(refs, tokens, 3, 20)] == ["d#0"]
    assert len(within_budget(refs, tokens, 2, None)) == 2
