"""A tracked prefix whose own refs went stale is invalidated by the first warm op that finds
it so, instead of every later query of it sending the same stale op (which, each skipped in
turn, kept the ops behind it waiting after a takeover)."""

from __future__ import annotations

from schemas import ChunkRef
from streams.decide import logic
from streams.decide.records import PrefixOp, PrefixState
from streams.handle import handlers
from streams.sim import run_sync
from tests.unit.conftest import P1, REFS, Port, pipeline, query

NEW = [ChunkRef(chunk_id="d.md#0", content_hash="2" * 64)]


def tracked(refs=REFS, **update) -> PrefixState:
    return PrefixState(tenant="default", chunk_refs=refs, token_ids=[7] * 32,
                       questions=["why?"], expires_at=1000.0, **update)


def op(refs=REFS, kind="warm") -> PrefixOp:
    return PrefixOp(op=kind, prefix_hash=P1, chunk_refs=refs, question="why?", reason="query")


def test_a_stale_op_naming_the_tracked_refs_invalidates_that_prefix_by_hash():
    inv = logic.stale_prefix_invalidation(op(), tracked())
    assert inv is not None
    assert (inv.op, inv.prefix_hash, inv.tenant, inv.chunk_refs) == ("invalidate", P1,
                                                                    "default", [])


def test_a_stale_op_with_other_refs_or_nothing_tracked_only_skips():
    assert logic.stale_prefix_invalidation(op(NEW), tracked()) is None
    assert logic.stale_prefix_invalidation(op(), None) is None


def test_queries_of_a_prefix_whose_invalidation_was_missed_stop_sending_stale_ops():
    port = Port({("default", "d.md#0"): "2" * 64})  # d.md#0 was edited
    p, out = pipeline(port)
    p.tables.prefix_states[P1] = tracked()  # its invalidation missed it
    run_sync(handlers.on_query(p, query()))
    [stale] = out.ops
    assert stale.op == "warm" and stale.chunk_refs == REFS
    run_sync(handlers.on_prefix_op(p, stale))
    assert p.stats["stale_warm_skipped"] == 1 and p.stats["stale_prefixes_dropped"] == 1
    assert P1 not in p.tables.prefixes
    assert [(c.op, c.prefix_hash) for c in out.commands] == [("invalidate", P1)]
    out.ops.clear()
    for _ in range(3):  # the load goes on asking with the old refs
        run_sync(handlers.on_query(p, query()))
    assert out.ops == []
