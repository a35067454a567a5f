"""The streams handlers over dict tables and an in-memory outbox (no Kafka, no store)."""

from __future__ import annotations

import asyncio

import pytest

from schemas import ChunkRef, KbChange, WorkerEvent
from streams.decide import logic
from streams.decide.hot import HotPayload
from streams.decide.records import DocState, PrefixOp, PrefixState, WorkerState, doc_key
from streams.handle import handlers
from streams.handle.ports import WarmPrefix
from streams.sim import run_sync
from tests.unit.conftest import P1, REFS, Port, ask, edited, pipeline, query


def test_a_new_query_prefix_is_registered_with_its_tokens():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port)
    run_sync(handlers.on_query(p, query()))
    [op] = out.ops
    assert (op.op, op.prefix_hash, op.question, op.reason) == ("warm", P1, "why?", "query")
    assert op.token_ids == [7] * 32 and op.chunk_refs == REFS


def test_a_known_fresh_held_prefix_asked_again_sends_nothing():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, prefix_ttl_s=60.0)
    p.tables.prefix_states[P1] = PrefixState(
        tenant="default",
        chunk_refs=REFS,
        token_ids=[7] * 32,
        questions=["why?"],
        expires_at=150.0,
    )
    held = WorkerState(worker_id="w1", ready=True, mem_total=1000, prefixes=[P1], last_seen=100)
    p.tables.worker_states["w1"] = held
    run_sync(handlers.on_query(p, query()))
    assert out.ops == [] and port.calls == []
    # A new question on it is recorded (without tokens: the state has them).
    run_sync(handlers.on_query(p, query("how?")))
    [op] = out.ops
    assert op.question == "how?" and op.token_ids == [] and port.calls == []


def test_query_tracking_can_be_switched_off():
    p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}), track_queries=False)
    run_sync(handlers.on_query(p, query()))
    assert out.ops == [] and p.stats["queries"] == 1


def test_a_query_whose_chunks_changed_since_is_not_registered():
    p, out = pipeline(Port({("default", "d.md#0"): "2" * 64}))
    run_sync(handlers.on_query(p, query()))
    assert out.ops == []


def test_a_prefill_also_warms_the_prompts_of_its_last_asked_questions():
    port = Port({("default", "d.md#0"): "1" * 64})
    port.tails = {"why?": [5] * 20, "how?": [6] * 18, "old?": [4] * 16}
    p, out = pipeline(port, warm_question_tails=2)
    state = PrefixState(tenant="default", chunk_refs=REFS, token_ids=[7] * 32,
                        questions=["how?", "old?"], expires_at=0.0)
    p.tables.prefix_states[P1] = state
    run_sync(handlers.on_query(p, query("why?")))
    [op] = out.ops
    run_sync(handlers.on_prefix_op(p, op))  # on no worker: prefilled
    prefix, *tails = out.commands
    assert prefix.token_ids == [7] * 32 and prefix.op == "prefill"
    # The question just asked first, then the one asked before it; "old?" is past the limit.
    assert [c.token_ids for c in tails] == [[7] * 32 + [5] * 20, [7] * 32 + [6] * 18]
    for tail in tails:
        assert (tail.op, tail.worker_id, tail.ttl_s, tail.chunk_refs, tail.pin) == (
            "prefill", prefix.worker_id, prefix.ttl_s, prefix.chunk_refs, False)
        assert tail.command_id != prefix.command_id and tail.prefix_hash == P1
    p2, out2 = pipeline(port, warm_question_tails=0)
    p2.tables.prefix_states[P1] = state
    run_sync(handlers.on_prefix_op(p2, op))
    assert [c.token_ids for c in out2.commands] == [[7] * 32]


def test_an_unmatched_prefix_asks_the_store_once_per_interval_not_per_query():
    # The client reports a prefix the app does not build from these chunks (here: they
    # changed since); every query of it used to retrieve the chunks again.
    now = [100.0]
    p, out = pipeline(Port({("default", "d.md#0"): "2" * 64}), query_op_interval_s=2.0)
    p.clock = lambda: now[0]
    for _ in range(5):
        run_sync(handlers.on_query(p, query()))
    assert p.rag.calls == ["prefix_for_refs"] and p.stats["query_prefix_unmatched"] == 1
    now[0] += 2.0
    run_sync(handlers.on_query(p, query()))
    assert p.rag.calls == ["prefix_for_refs"] * 2 and out.ops == [] and p.stats["queries"] == 6


def test_freshness_is_checked_in_the_ops_tenant():
    # The chunk is current for tenant "acme" only: a warm op of "acme" prefills.
    port = Port({("acme", "d.md#0"): "1" * 64})
    p, out = pipeline(port)
    op = PrefixOp(
        op="warm",
        prefix_hash=P1,
        tenant="acme",
        chunk_refs=REFS,
        token_ids=[7] * 32,
        question="why?",
    )
    run_sync(handlers.on_prefix_op(p, op))
    assert [c.op for c in out.commands] == ["prefill"] and out.commands[0].tenant == "acme"
    other = op.model_copy(update={"tenant": "default", "prefix_hash": "b" * 64})
    run_sync(handlers.on_prefix_op(p, other))
    assert p.stats["stale_warm_skipped"] == 1


def test_run_sync_refuses_a_handler_that_waits():
    async def waits() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="waited on I/O"):
        run_sync(waits())


def test_a_worker_that_becomes_ready_gets_the_tracked_prefixes_most_in_use():
    port = Port({("default", "d.md#0"): "1" * 64})
    # One step: every prefix that fits at once (the steps: tests/unit/test_progressive.py).
    p, out = pipeline(port, prefix_ttl_s=60.0, hot_tokens=False, kv_bytes_per_token=10,
                      warmup_steps=1)
    for name, expires, used_at in (("1", 150.0, 50.0), ("2", 90.0, 60.0), ("3", 150.0, 70.0)):
        p.tables.prefix_states[name * 64] = PrefixState(
            tenant="default",
            chunk_refs=REFS,
            token_ids=[7] * 32,
            expires_at=expires,
            updated_at=used_at,
        )  # "2" expired at now=100
    ready = WorkerEvent(worker_id="w2", kind="ready", mem_total_bytes=10_000)
    run_sync(handlers.on_worker_event(p, ready))
    # Expired ones too (an empty worker has room); the most recently used ("3") goes last,
    # so the worker's LRU keeps it longest.
    assert [(o.op, o.prefix_hash, o.target_worker) for o in out.ops] == [
        ("warm_on", "1" * 64, "w2"),
        ("warm_on", "2" * 64, "w2"),
        ("warm_on", "3" * 64, "w2"),
    ]
    # Only what fits the worker's free memory is sent (32 tokens x 10 bytes each).
    out.ops.clear()
    run_sync(handlers.on_worker_event(p, ready.model_copy(update={"mem_used_bytes": 9_500})))
    assert [o.prefix_hash for o in out.ops] == ["3" * 64]


def test_a_ready_worker_gets_tracked_prefixes_in_the_room_the_hot_set_leaves():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, prefix_ttl_s=60.0, hot_share=0.5, kv_bytes_per_token=10,
                      warmup_steps=1)
    for name in "12":
        p.tables.prefix_states[name * 64] = PrefixState(
            tenant="default", chunk_refs=REFS, token_ids=[7] * 32, expires_at=150.0,
        )
    # No hot prefix yet: both fit (640 bytes), though the hot share is half of 700.
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w2", kind="ready",
                                              mem_total_bytes=700)))
    assert sorted(o.prefix_hash for o in out.ops) == ["1" * 64, "2" * 64]


def test_a_hot_prefix_no_worker_holds_is_warmed_again_on_the_next_plan():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, hot_min_count=1.0, track_queries=False, kv_bytes_per_token=1)
    for _ in range(2):
        run_sync(handlers.on_query(p, query()))
    run_sync(handlers.plan_hot(p))
    assert [(o.op, o.pin) for o in out.ops] == [("warm", True)]
    run_sync(handlers.plan_hot(p))  # nobody reported it held: asked again
    assert len(out.ops) == 2
    held = WorkerState(worker_id="w1", ready=True, mem_total=1000, prefixes=[P1], last_seen=100)
    p.tables.worker_states["w1"] = held
    run_sync(handlers.plan_hot(p))  # held now: nothing more
    assert len(out.ops) == 2


def test_a_hot_prefix_whose_prefill_is_on_its_way_is_not_retrieved_again_each_tick():
    port = Port({("default", "d.md#0"): "1" * 64})
    clock = {"now": 100.0}
    p, out = pipeline(port, hot_min_count=1.0, track_queries=False, kv_bytes_per_token=1)
    p.clock = lambda: clock["now"]
    for _ in range(2):
        run_sync(handlers.on_query(p, query()))
    run_sync(handlers.plan_hot(p))
    [op] = out.ops
    run_sync(handlers.on_prefix_op(p, op))  # its owner sends the prefill
    assert [c.op for c in out.commands] == ["prefill"]
    asked = len(port.calls)
    run_sync(handlers.plan_hot(p))  # not held yet, but on its way: nothing more
    assert len(out.ops) == 1 and len(port.calls) == asked
    clock["now"] += logic.PREFILL_WAIT_S + 1  # never confirmed: asked again
    run_sync(handlers.plan_hot(p))
    assert len(out.ops) == 2


def test_a_hot_prefix_whose_question_retrieves_nothing_is_not_retrieved_every_tick():
    port = Port({})  # its tenant's index is empty: its refs are not current, nothing retrieved
    clock = {"now": 100.0}
    p, out = pipeline(port, hot_min_count=1.0, track_queries=False, kv_bytes_per_token=1,
                      hot_unfound_retry_s=30.0, worker_stale_s=3600.0)
    p.clock = lambda: clock["now"]
    for _ in range(2):
        run_sync(handlers.on_query(p, query()))
    run_sync(handlers.plan_hot(p))
    assert port.calls.count("prefix_for_question") == 1 and not out.ops
    clock["now"] += 29.0
    run_sync(handlers.plan_hot(p))  # same index, same answer: not asked again
    assert port.calls.count("prefix_for_question") == 1
    clock["now"] += 2.0
    run_sync(handlers.plan_hot(p))  # the retry interval is over: asked again
    assert port.calls.count("prefix_for_question") == 2 and not out.ops


def test_the_sweep_forgets_long_expired_prefixes_nobody_holds_and_unlinks_them():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, forget_after_s=30.0)
    cases = {
        "1": dict(expires_at=60.0),  # expired 40 s ago, nobody holds it: forgotten
        "2": dict(expires_at=80.0),  # expired 20 s ago: kept a while longer
        "3": dict(expires_at=60.0, hot=True),  # hot: the hot set owns it
        "4": dict(expires_at=60.0),  # held by w1 (its worker extended it): kept
    }
    for name, fields in cases.items():
        p.tables.prefix_states[name * 64] = PrefixState(
            tenant="default", chunk_refs=REFS, token_ids=[7] * 32, **fields
        )
    p.tables.doc_prefixes["d.md"] = {name * 64: [r.model_dump() for r in REFS] for name in cases}
    holder = WorkerState(worker_id="w1", ready=True, mem_total=1000, prefixes=["4" * 64])
    p.tables.worker_states["w1"] = holder  # not live: still a holder
    assert run_sync(handlers.sweep_prefixes(p)) == 1
    [op] = out.ops
    assert (op.op, op.prefix_hash) == ("forget", "1" * 64)
    # The owning partition drops it and unlinks it from its document.
    run_sync(handlers.on_prefix_op(p, op))
    assert sorted(p.tables.prefixes) == [n * 64 for n in "234"]
    [unlink] = out.links
    run_sync(handlers.on_doc_link(p, unlink))
    assert sorted(p.tables.doc_prefixes["d.md"]) == [n * 64 for n in "234"]
    assert p.stats["forgotten"] == 1 and out.commands == []


def test_a_prefix_used_again_after_the_sweep_chose_it_is_kept():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, forget_after_s=10.0)
    p.tables.prefix_states[P1] = PrefixState(
        tenant="default", chunk_refs=REFS, token_ids=[7] * 32, expires_at=50.0
    )
    run_sync(handlers.sweep_prefixes(p))
    [forget] = out.ops
    run_sync(handlers.on_query(p, query()))  # asked again before the forget op is handled
    run_sync(handlers.on_prefix_op(p, out.ops[1]))
    run_sync(handlers.on_prefix_op(p, forget))
    assert P1 in p.tables.prefixes and p.stats["forgotten"] == 0


class RetrievingPort(Port):
    """A port whose questions retrieve the edited chunk's new version."""

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        refs = [ChunkRef(chunk_id="d.md#0", content_hash="2" * 64)]
        return WarmPrefix(prefix_hash="f" * 64, token_ids=[8] * 32, chunk_refs=refs)


def _edit_d_md(p: handlers.HandlerDeps, dependents: tuple[str, ...]) -> None:
    """Index v2 of `d.md` (its one chunk changed) with `dependents` linked to v1's chunk."""
    key = doc_key("default", "d.md")
    p.tables.doc_states[key] = DocState(version=1, chunks={"d.md#0": "1" * 64})
    p.tables.doc_prefixes[key] = {h: [r.model_dump(mode="json") for r in REFS]
                                  for h in dependents}
    change = KbChange(op="upsert", doc_id="d.md", version=2, text="new")
    run_sync(handlers.apply_indexed(p, change, {"d.md#0": "2" * 64}))


def test_an_edit_rewarms_evicted_dependents_asked_recently_within_its_budget():
    port = RetrievingPort({("default", "d.md#0"): "2" * 64})
    # 1,000 bytes of worker memory, 1 byte a token: 40 tokens for one edit's re-warms.
    # The hot window ranks the re-warms (event-rag's rule; `edit_watch` tested below).
    p, out = pipeline(port, prefix_ttl_s=60.0, hot_tokens=False, kv_bytes_per_token=1,
                      edit_rewarm_share=0.04, edit_watch=False)
    popular, rare = "1" * 64, "2" * 64
    for name, question in ((popular, "popular?"), (rare, "rare?")):
        p.tables.prefix_states[name] = PrefixState(  # tracked, held by no worker
            tenant="default", chunk_refs=REFS, token_ids=[7] * 32, questions=[question],
            expires_at=150.0,
        )
        asks = 3 if name == popular else 1
        for _ in range(asks):
            p.tracker.observe(name, HotPayload("default", question, tuple(REFS), 32), 100.0)
    _edit_d_md(p, (popular, rare))
    invalidations = list(out.ops)
    # Least asked first; only the most asked fits the budget (32 of 40 tokens).
    assert [(o.op, o.prefix_hash, o.rewarm) for o in invalidations] == [
        ("invalidate", rare, False), ("invalidate", popular, True)
    ]
    out.ops.clear()
    for op in invalidations:
        run_sync(handlers.on_prefix_op(p, op))
    assert [(o.op, o.question, o.pin, o.hold) for o in out.ops] == [
        ("warm", "popular?", False, True)]


@pytest.mark.parametrize(("tier_bytes", "rest", "rewarmed"), [
    (0, 64, 1), (4096, 64, 2), (4096, 0, 1)])
def test_an_edit_rewarms_every_dependent_where_the_workers_spill_to_a_tier(
        tier_bytes, rest, rewarmed):
    port = RetrievingPort({("default", "d.md#0"): "2" * 64})
    # 40 tokens for one edit's re-warms: the rare prefix fits only past the budget.
    p, out = pipeline(port, prefix_ttl_s=60.0, hot_tokens=False, kv_bytes_per_token=1,
                      edit_rewarm_share=0.04, edit_watch=False, edit_rewarm_rest=rest)
    worker = p.tables.worker_states["w1"]
    p.tables.workers["w1"] = worker.model_copy(
        update={"tier_bytes": tier_bytes}).model_dump(mode="json")
    popular, rare = "1" * 64, "2" * 64
    for name, asks in ((popular, 3), (rare, 1)):
        p.tables.prefix_states[name] = PrefixState(  # tracked, held by no worker
            tenant="default", chunk_refs=REFS, token_ids=[7] * 32, questions=[name],
            expires_at=150.0,
        )
        for _ in range(asks):
            p.tracker.observe(name, HotPayload("default", name, tuple(REFS), 32), 100.0)
    _edit_d_md(p, (popular, rare))
    assert sum(o.rewarm and o.hold for o in out.ops) == rewarmed


@pytest.mark.parametrize("pinned", [0, 90])
def test_an_edit_holds_dependents_asked_twice_before_the_hot_window_in_unpinned_room(pinned):
    port = RetrievingPort({("default", "d.md#0"): "2" * 64})
    # 1,000 bytes, 1 byte a token: 100 tokens for one edit; `pinned` of them held already.
    p, out = pipeline(port, now=5000.0, hot_tokens=False, kv_bytes_per_token=1,
                      edit_rewarm_share=0.1, edit_recheck_questions=0)
    worker = p.tables.worker_states["w1"]
    p.tables.worker_states["w1"] = worker.model_copy(update={"pinned": pinned})
    twice, once = "1" * 64, "2" * 64
    for name, times in ((twice, (100.0, 900.0)), (once, (1000.0,))):
        p.tables.prefix_states[name] = PrefixState(  # tracked, held by no worker
            tenant="default", chunk_refs=REFS, token_ids=[7] * 32, questions=[name],
            expires_at=150.0,
        )
        for at in times:  # long before the hot window (600 s) ending at 5,000 s
            p.asks.observe(name, "default", name, REFS, 32, at)
    _edit_d_md(p, (twice, once))
    # Asked once: never; asked twice: held while 32 tokens fit what no pin holds (100 - 90).
    assert {o.prefix_hash for o in out.ops if o.hold} == ({twice} if pinned == 0 else set())


def test_the_hot_sets_dependents_take_no_edit_budget():
    port = RetrievingPort({("default", "d.md#0"): "2" * 64})
    p, out = pipeline(port, prefix_ttl_s=60.0, kv_bytes_per_token=1, edit_rewarm_share=0.04,
                      edit_watch=False)
    popular, rare = "1" * 64, "2" * 64
    for name, asks in ((popular, 3), (rare, 1)):
        for _ in range(asks):
            p.tracker.observe(name, HotPayload("default", name, tuple(REFS), 32), 100.0)
    # The hot set pins the popular one already (re-warmed pinned as hot, not held).
    p.tracker.hot["k"] = PrefixOp(op="warm", prefix_hash=popular, pin=True)
    _edit_d_md(p, (popular, rare))
    assert {o.prefix_hash for o in out.ops if o.hold} == {rare}


def test_the_ask_an_edit_held_a_prefix_for_releases_it_and_an_unasked_hold_ends():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, prefix_ttl_s=60.0, edit_hold_s=50.0)
    held_state = PrefixState(tenant="default", chunk_refs=REFS, token_ids=[7] * 32,
                             questions=["why?"], expires_at=150.0, held_at=90.0)
    p.tables.prefix_states[P1] = held_state
    w1 = WorkerState(worker_id="w1", ready=True, mem_total=1000, prefixes=[P1], last_seen=100)
    p.tables.worker_states["w1"] = w1
    # Known, fresh and held by a worker, but held for this ask: the op goes out.
    run_sync(handlers.on_query(p, query()))
    [op] = out.ops
    run_sync(handlers.on_prefix_op(p, op))
    assert [c.op for c in out.commands] == ["release"]
    assert p.tables.prefix_states[P1].held_at is None
    # Unasked for `edit_hold_s`: the sweep ends the hold.
    p.tables.prefix_states[P1] = held_state.model_copy(update={"held_at": 40.0})
    out.ops.clear()
    out.commands.clear()
    run_sync(handlers.sweep_prefixes(p))
    [end] = out.ops
    assert (end.op, end.hold) == ("cool", True)
    run_sync(handlers.on_prefix_op(p, end))
    assert [c.op for c in out.commands] == ["release"]


class MovedPort(RetrievingPort):
    """Questions about hooks now retrieve d.md's new chunk; the others retrieve as before."""

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        self.calls.append(question)
        if question.startswith("hooks"):
            return super().prefix_for_question(question, tenant)
        if question.startswith("moved"):  # its top-3 changed, but not through d.md
            refs = [ChunkRef(chunk_id="e.md#0", content_hash="9" * 64)]
            return WarmPrefix(prefix_hash="e" * 64, token_ids=[9] * 32, chunk_refs=refs)
        return WarmPrefix(prefix_hash="5" * 64, token_ids=[5] * 32, chunk_refs=REFS)


def test_an_edit_warms_the_questions_whose_top3_its_chunks_entered_through_no_link():
    port = MovedPort({("default", "d.md#0"): "2" * 64})
    p, out = pipeline(port, kv_bytes_per_token=1, edit_rewarm_share=0.5, hot_tokens=False,
                      track_queries=False)
    other = [ChunkRef(chunk_id="x.md#0", content_hash="7" * 64)]
    ask(p, "4" * 64, "hooks?", 10.0, other)  # uses no chunk of d.md
    ask(p, "6" * 64, "moved?", 20.0, other)
    ask(p, "5" * 64, "same?", 30.0)  # retrieves what it used: nothing changes
    edited(p, [], 40.0)
    [op] = out.ops
    assert (op.op, op.prefix_hash, op.question, op.hold) == ("warm", "f" * 64, "hooks?", True)
    assert p.stats["edit_rechecks"] == 3 and p.stats["edit_recheck_warms"] == 1
    # Within what the edit's budget leaves: 32 tokens do not fit in 10.
    q, out = pipeline(MovedPort({}), kv_bytes_per_token=1, edit_rewarm_share=0.01,
                      hot_tokens=False, track_queries=False)
    ask(q, "4" * 64, "hooks?", 10.0, other)
    edited(q, [], 40.0)
    assert out.ops == []
    # Without edit_watch (event-rag) an edit re-checks its own dependents only.
    q, out = pipeline(MovedPort({}), hot_tokens=False, track_queries=False, edit_watch=False)
    q.tracker.observe("4" * 64, HotPayload("default", "hooks?", tuple(other), 32), 10.0)
    edited(q, [], 40.0)
    assert out.ops == [] and q.rag.calls == []
