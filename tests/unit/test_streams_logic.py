"""The streams app's pure decisions: KB changes, prefix ops, placement, hot set."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import ChunkRef, KbChange, WorkerEvent
from schemas.prefix import aligned_tokens
from streams.decide.hot import SpaceSaving
from streams.decide.logic import (
    HotCandidate,
    apply_doc_link,
    apply_worker_event,
    choose_worker,
    hold_ended,
    hold_pins,
    plan_hot_set,
    plan_kb_change,
    plan_prefix_op,
    plan_rewarm,
)
from streams.decide.records import DocLink, DocState, PrefixOp, PrefixState, WorkerState

H1, H2, H3 = "a" * 32, "b" * 32, "c" * 32
P1, P2 = "1" * 32, "2" * 32


def ref(cid: str, h: str) -> ChunkRef:
    return ChunkRef(chunk_id=cid, content_hash=h)


def upsert(version: int, text: str = "t") -> KbChange:
    return KbChange(op="upsert", doc_id="d.md", version=version, text=text)


def worker(
    wid: str, used: int = 0, total: int = 100, prefixes=(), ready=True, pinned=None
) -> WorkerState:
    return WorkerState(
        worker_id=wid,
        ready=ready,
        mem_used=used,
        mem_total=total,
        pinned=used if pinned is None else pinned,
        prefixes=list(prefixes),
    )


class TestKbChange:
    def test_changed_chunk_invalidates_and_unchanged_extends(self):
        prior = DocState(version=1, chunks={"d.md#0": H1, "d.md#1": H2})
        deps = {P1: [ref("d.md#0", H1)], P2: [ref("d.md#1", H2)]}
        plan = plan_kb_change(upsert(2), prior, {"d.md#0": H3, "d.md#1": H2}, deps, now=5.0)
        ops = {op.prefix_hash: op.op for op in plan.ops}
        assert ops == {P1: "invalidate", P2: "extend_ttl"}
        assert plan.state.chunks == {"d.md#0": H3, "d.md#1": H2}
        assert plan.state.version == 2

    def test_ops_go_least_asked_first_so_lru_keeps_the_most_asked_rewarms(self):
        prior = DocState(version=1, chunks={"d.md#0": H1})
        p3 = "3" * 32
        deps = {P1: [ref("d.md#0", H1)], P2: [ref("d.md#0", H1)], p3: [ref("d.md#0", H1)]}
        recent = [HotCandidate(P1, 5.0, 10), HotCandidate(P2, 1.0, 10)]
        plan = plan_kb_change(upsert(2), prior, {"d.md#0": H3}, deps, 0.0, recent, 100)
        assert [op.prefix_hash for op in plan.ops] == [p3, P2, P1]
        unranked = plan_kb_change(upsert(2), prior, {"d.md#0": H3}, deps, 0.0)
        assert [op.prefix_hash for op in unranked.ops] == sorted(deps)
        assert not any(op.rewarm for op in unranked.ops)  # no budget: held or hot only

    def test_edit_rewarms_and_holds_recent_dependents_most_asked_first_within_budget(self):
        prior = DocState(version=1, chunks={"d.md#0": H1, "d.md#1": H2})
        p3, p4 = "3" * 32, "4" * 32
        deps = {P1: [ref("d.md#0", H1)], P2: [ref("d.md#0", H1)], p3: [ref("d.md#0", H1)],
                p4: [ref("d.md#1", H2)]}  # p4 depends on an unchanged chunk
        recent = [HotCandidate(P1, 1.0, 10), HotCandidate(P2, 4.0, 30),
                  HotCandidate(p3, 2.0, 10), HotCandidate(p4, 9.0, 10)]
        new = {"d.md#0": H3, "d.md#1": H2}
        plan = plan_kb_change(upsert(2), prior, new, deps, 0.0, recent, 40)
        # p4 (most asked, still valid: its question may retrieve the edit now) then P2 fill
        # 40 tokens; p3 and P1 do not fit.
        assert {op.prefix_hash for op in plan.ops if op.rewarm} == {p4, P2}
        assert {op.prefix_hash for op in plan.ops if op.hold} == {p4, P2}
        assert {(op.prefix_hash, op.op) for op in plan.ops if op.hold} == {
            (p4, "extend_ttl"), (P2, "invalidate")}
        # A prefix asked outside the hot window is not chosen, whatever the budget.
        plan = plan_kb_change(upsert(2), prior, new, deps, 0.0, recent[1:], 10_000)
        assert {op.prefix_hash for op in plan.ops if op.rewarm} == {P2, p3, p4}

    def test_dependents_asked_long_ago_come_after_recent_ones_within_both_bounds(self):
        prior = DocState(version=1, chunks={"d.md#0": H1})
        p3, p4 = "3" * 32, "4" * 32
        deps = {h: [ref("d.md#0", H1)] for h in (P1, P2, p3, p4)}
        recent = [HotCandidate(P1, 1.0, 10)]
        older = [HotCandidate(P2, 9.0, 20), HotCandidate(p3, 5.0, 10),
                 HotCandidate(p4, 2.0, 10), HotCandidate("9" * 32, 7.0, 1)]  # no dependent
        new = {"d.md#0": H3}
        # 10 recent + 20 older: p3 would fit the edit's 45 tokens, not the 25 for older.
        plan = plan_kb_change(upsert(2), prior, new, deps, 0.0, recent, 45, older, 25)
        assert {op.prefix_hash for op in plan.ops if op.hold} == {P1, P2}
        # The edit's budget bounds them too: after P1, 15 tokens are left: P2 is skipped.
        plan = plan_kb_change(upsert(2), prior, new, deps, 0.0, recent, 25, older, 100)
        assert {op.prefix_hash for op in plan.ops if op.rewarm} == {P1, p3}
        # No room left unpinned: only the recent ones.
        plan = plan_kb_change(upsert(2), prior, new, deps, 0.0, recent, 100, older, 0)
        assert {op.prefix_hash for op in plan.ops if op.rewarm} == {P1}

    def test_with_a_tier_below_the_device_every_dependent_is_rewarmed_and_held(self):
        prior = DocState(version=1, chunks={"d.md#0": H1, "d.md#1": H2})
        p3 = "3" * 32
        deps = {P1: [ref("d.md#0", H1)], P2: [ref("d.md#0", H1)], p3: [ref("d.md#1", H2)]}
        recent = [HotCandidate(P1, 1.0, 10)]
        new = {"d.md#0": H3, "d.md#1": H2}
        # No budget at all and P2, p3 never asked lately: each is still re-warmed (p3's
        # chunk is unchanged, but its question may now retrieve the edit) and held.
        plan = plan_kb_change(upsert(2), prior, new, deps, 0.0, recent, 0, rewarm_rest=3)
        assert {op.prefix_hash for op in plan.ops if op.rewarm and op.hold} == {P1, P2, p3}
        # At most `rewarm_rest` of them: the one asked lately first, then in hash order.
        plan = plan_kb_change(upsert(2), prior, new, deps, 0.0, recent, 0, rewarm_rest=2)
        assert {op.prefix_hash for op in plan.ops if op.rewarm} == {P1, min(P2, p3)}
        # A re-ingest that changed nothing re-warms nothing, tier or not.
        same = {"d.md#0": H1, "d.md#1": H2}
        plan = plan_kb_change(upsert(2), prior, same, deps, 0.0, recent, 100, rewarm_rest=3)
        assert not any(op.rewarm or op.hold for op in plan.ops)

    def test_a_reingest_that_changed_nothing_holds_nothing(self):
        prior = DocState(version=1, chunks={"d.md#0": H1})
        deps = {P1: [ref("d.md#0", H1)]}
        plan = plan_kb_change(upsert(2), prior, {"d.md#0": H1}, deps, 0.0,
                              [HotCandidate(P1, 5.0, 10)], 100)
        assert not any(op.rewarm or op.hold for op in plan.ops)

    def test_identical_reingest_only_extends(self):
        prior = DocState(version=3, chunks={"d.md#0": H1})
        plan = plan_kb_change(upsert(3), prior, {"d.md#0": H1}, {P1: [ref("d.md#0", H1)]}, 0.0)
        assert [op.op for op in plan.ops] == ["extend_ttl"]

    def test_removed_chunk_invalidates(self):
        prior = DocState(version=1, chunks={"d.md#0": H1, "d.md#1": H2})
        plan = plan_kb_change(upsert(2), prior, {"d.md#0": H1}, {P1: [ref("d.md#1", H2)]}, 0.0)
        assert [op.op for op in plan.ops] == ["invalidate"]

    def test_delete_invalidates_everything(self):
        change = KbChange(op="delete", doc_id="d.md", version=4)
        plan = plan_kb_change(change, DocState(version=3), {}, {P1: [ref("d.md#0", H1)]}, 0.0)
        assert plan.state.deleted and [op.op for op in plan.ops] == ["invalidate"]

    def test_older_version_changes_nothing(self):
        prior = DocState(version=5, chunks={"d.md#0": H1})
        plan = plan_kb_change(upsert(4), prior, {"d.md#0": H3}, {P1: [ref("d.md#0", H1)]}, 0.0)
        assert plan.stale and plan.ops == [] and plan.state is None

    def test_doc_links_add_and_remove(self):
        links = apply_doc_link(
            {}, DocLink(doc_id="d.md", prefix_hash=P1, chunk_refs=[ref("d.md#0", H1)])
        )
        assert list(links) == [P1]
        assert apply_doc_link(links, DocLink(doc_id="d.md", prefix_hash=P1, link=False)) == {}


def state(**kw) -> PrefixState:
    base = dict(
        tenant="default",
        chunk_refs=[ref("d.md#0", H1)],
        token_ids=[1] * 32,
        questions=["why?"],
        expires_at=10.0,
    )
    base.update(kw)
    return PrefixState(**base)


class TestPrefixOps:
    def test_forget_drops_only_an_expired_unheld_cold_prefix(self):
        op = PrefixOp(op="forget", prefix_hash=P1)
        dropped = plan_prefix_op(op, state(expires_at=10.0), [worker("w1")], now=11.0, ttl_s=60)
        assert dropped.state is None and dropped.commands == []
        assert [(ln.prefix_hash, ln.link) for ln in dropped.links] == [(P1, False)]
        kept = [
            (state(expires_at=20.0), [worker("w1")]),  # extended since the sweep looked
            (state(expires_at=10.0, hot=True), [worker("w1")]),
            (state(expires_at=10.0), [worker("w1", prefixes=[P1], ready=False)]),
        ]
        for before, workers in kept:
            plan = plan_prefix_op(op, before, workers, now=11.0, ttl_s=60)
            assert plan.state == before and plan.links == [] and plan.counters == {}
        assert plan_prefix_op(op, None, [], now=11.0, ttl_s=60).state is None

    def test_invalidate_broadcasts_unlinks_and_requeues_questions(self):
        op = PrefixOp(op="invalidate", prefix_hash=P1, reason="edit")
        plan = plan_prefix_op(op, state(), [worker("w1", prefixes=[P1])], 0.0, 60.0)
        (cmd,) = plan.commands
        assert cmd.op == "invalidate" and cmd.worker_id is None and cmd.prefix_hash == P1
        assert plan.state is None
        assert [(lk.doc_id, lk.link) for lk in plan.links] == [("d.md", False)]
        assert plan.rewarm_questions == ["why?"]

    def test_extend_ttl_unknown_prefix_does_nothing(self):
        plan = plan_prefix_op(PrefixOp(op="extend_ttl", prefix_hash=P1), None, [], 0.0, 60.0)
        assert plan.commands == [] and plan.state is None

    def test_extend_ttl_moves_expiry(self):
        plan = plan_prefix_op(PrefixOp(op="extend_ttl", prefix_hash=P1), state(), [], 100.0, 60.0)
        assert plan.commands[0].op == "extend_ttl" and plan.state.expires_at == 160.0

    def test_edit_to_a_prefix_no_worker_holds_rewarms_nothing_unless_hot_or_chosen(self):
        op = PrefixOp(op="invalidate", prefix_hash=P1, reason="edit")
        cold = plan_prefix_op(op, state(), [worker("w1")], 0.0, 60.0)
        assert cold.rewarm_questions == [] and [c.op for c in cold.commands] == ["invalidate"]
        hot = plan_prefix_op(op, state(hot=True), [worker("w1")], 0.0, 60.0)
        assert hot.rewarm_questions == ["why?"] and hot.rewarm_pin
        # Evicted, but the KB plan chose it within the edit's budget: re-warmed, unpinned.
        chosen = plan_prefix_op(op.model_copy(update={"rewarm": True}), state(),
                                [worker("w1")], 0.0, 60.0)
        assert chosen.rewarm_questions == ["why?"] and not chosen.rewarm_pin
        recheck = PrefixOp(op="extend_ttl", prefix_hash=P1, recheck=True, reason="edit")
        assert plan_prefix_op(recheck, state(), [worker("w1")], 0.0, 60.0).rewarm_questions == []
        held = [worker("w1", prefixes=[P1])]
        assert plan_prefix_op(recheck, state(), held, 0.0, 60.0).rewarm_questions == ["why?"]

    def test_warm_new_prefix_prefills_on_least_loaded_worker(self):
        op = PrefixOp(
            op="warm",
            prefix_hash=P1,
            token_ids=[5] * 32,
            chunk_refs=[ref("d.md#0", H1)],
            question="q?",
        )
        workers = [worker("w1", used=60), worker("w2", used=10)]
        plan = plan_prefix_op(op, None, workers, 0.0, 60.0)
        (cmd,) = plan.commands
        assert (cmd.op, cmd.worker_id, cmd.token_ids) == ("prefill", "w2", [5] * 32)
        assert plan.state.questions == ["q?"] and plan.state.worker_id == "w2"
        assert [lk.link for lk in plan.links] == [True]

    def test_warm_already_held_adds_question_only(self):
        op = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32, question="new?")
        held = [worker("w1", prefixes=[P1])]
        plan = plan_prefix_op(op, state(expires_at=50.0), held, 0.0, 60.0)
        assert plan.commands == [] and plan.state.questions == ["new?", "why?"]

    def test_warm_of_held_prefix_past_half_its_ttl_extends_the_holders_copy(self):
        op = PrefixOp(op="warm", prefix_hash=P1, question="why?")
        plan = plan_prefix_op(op, state(expires_at=30.0), [worker("w1", prefixes=[P1])], 5.0, 60.0)
        assert [(c.op, c.ttl_s) for c in plan.commands] == [("extend_ttl", 60.0)]
        assert plan.state.expires_at == 65.0 and plan.counters == {"ttl_extensions": 1}

    def test_warm_on_targets_the_new_worker(self):
        op = PrefixOp(op="warm_on", prefix_hash=P1, target_worker="w9", token_ids=[5] * 32)
        plan = plan_prefix_op(op, state(hot=True), [worker("w1", prefixes=[P1])], 0.0, 60.0)
        assert plan.commands[0].worker_id == "w9" and plan.commands[0].pin

    def test_warm_with_all_workers_full_sends_nothing(self):
        op = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32)
        plan = plan_prefix_op(op, None, [worker("w1", used=80)], 0.0, 60.0)
        assert plan.commands == [] and plan.counters == {"no_worker": 1}

    def test_cool_releases_pin(self):
        plan = plan_prefix_op(PrefixOp(op="cool", prefix_hash=P1), state(hot=True), [], 0.0, 60.0)
        assert plan.commands[0].op == "release" and not plan.state.hot


class TestEditHold:
    """A dependent an edit chose is pinned until its next ask (or the hold ends)."""

    def test_an_evicted_chosen_prefix_is_prefilled_pinned_and_held(self):
        op = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32, question="q?", hold=True,
                      reason="re-prefill after edit")
        plan = plan_prefix_op(op, None, [worker("w1")], 10.0, 60.0)
        (cmd,) = plan.commands
        assert (cmd.op, cmd.pin) == ("prefill", True)
        assert plan.state.held_at == 10.0 and not plan.state.hot  # not the hot set's pin

    def test_a_prefix_still_on_its_worker_is_pinned_in_place_once(self):
        op = PrefixOp(op="warm", prefix_hash=P1, question="why?", hold=True, reason="edit")
        held = [worker("w1", prefixes=[P1])]
        plan = plan_prefix_op(op, state(expires_at=50.0), held, 10.0, 60.0)
        (cmd,) = plan.commands
        assert (cmd.op, cmd.worker_id, cmd.pin) == ("prefill", "w1", True)
        again = plan_prefix_op(op, plan.state, held, 11.0, 60.0)
        assert again.commands == [] and again.state.held_at == 11.0

    def test_the_next_ask_releases_the_hold_but_not_a_hot_pin(self):
        ask = PrefixOp(op="warm", prefix_hash=P1, question="why?", reason="query")
        held = [worker("w1", prefixes=[P1])]
        plan = plan_prefix_op(ask, state(expires_at=50.0, held_at=5.0), held, 10.0, 60.0)
        assert [c.op for c in plan.commands] == ["release"] and plan.state.held_at is None
        hot = plan_prefix_op(ask, state(expires_at=50.0, held_at=5.0, hot=True), held, 10.0, 60.0)
        assert hot.commands == [] and hot.state.held_at is None and hot.state.hot
        plain = plan_prefix_op(ask, state(expires_at=50.0), held, 10.0, 60.0)
        assert plain.commands == []  # nothing held: nothing to release

    def test_an_unasked_hold_ends_and_cooling_keeps_the_other_pin(self):
        assert hold_ended(state(held_at=0.0), 100.0, 100.0)
        assert not hold_ended(state(held_at=0.0), 99.0, 100.0)
        assert not hold_ended(state(), 1e9, 100.0)
        end = PrefixOp(op="cool", prefix_hash=P1, hold=True, reason="hold ended")
        plan = plan_prefix_op(end, state(held_at=0.0), [], 100.0, 60.0)
        assert [c.op for c in plan.commands] == ["release"] and plan.state.held_at is None
        hot = plan_prefix_op(end, state(held_at=0.0, hot=True), [], 100.0, 60.0)
        assert hot.commands == [] and hot.state.hot and hot.state.held_at is None
        cooled = plan_prefix_op(PrefixOp(op="cool", prefix_hash=P1),
                                state(held_at=0.0, hot=True), [], 100.0, 60.0)
        assert cooled.commands == [] and not cooled.state.hot and cooled.state.held_at == 0.0

    def test_a_worker_with_a_kv_tier_holds_unpinned(self):
        # Its tier reported bytes: an evicted hold spills there and its ask reads it back,
        # so the hold keeps the device's bytes for request caching.
        tiered = worker("w1").model_copy(update={"tier_bytes": 4096})
        op = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32, question="q?", hold=True,
                      reason="re-prefill after edit")
        plan = plan_prefix_op(op, None, [tiered], 10.0, 60.0)
        (cmd,) = plan.commands
        assert (cmd.op, cmd.pin) == ("prefill", False) and plan.state.held_at == 10.0
        in_place = plan_prefix_op(op, state(expires_at=50.0),
                                  [tiered.model_copy(update={"prefixes": [P1]})], 10.0, 60.0)
        assert [(c.op, c.pin) for c in in_place.commands] == [("prefill", False)]
        # The hot set's pin is not a hold: it pins whatever the worker keeps below.
        hot = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32, pin=True, reason="hot")
        assert plan_prefix_op(hot, None, [tiered], 10.0, 60.0).commands[0].pin
        assert hold_pins("w1", [worker("w1")]) and not hold_pins("w1", [tiered])
        assert hold_pins("gone", [tiered])  # unknown: as without a tier

    def test_a_chosen_invalidation_rewarms_its_questions_held(self):
        op = PrefixOp(op="invalidate", prefix_hash=P1, reason="edit", rewarm=True, hold=True)
        plan = plan_prefix_op(op, state(), [worker("w1")], 0.0, 60.0)
        assert plan.rewarm_questions == ["why?"] and plan.rewarm_hold and not plan.rewarm_pin
        recheck = PrefixOp(op="extend_ttl", prefix_hash=P1, recheck=True, rewarm=True,
                           hold=True, reason="edit")
        plan = plan_prefix_op(recheck, state(), [worker("w1")], 0.0, 60.0)
        assert plan.rewarm_questions == ["why?"] and plan.rewarm_hold

    def test_an_invalidated_held_prefix_passes_its_hold_to_the_new_prefix(self):
        # An earlier edit held it for its question's next ask; this edit did not choose it.
        op = PrefixOp(op="invalidate", prefix_hash=P1, reason="edit")
        held = [worker("w1", prefixes=[P1])]
        plan = plan_prefix_op(op, state(held_at=5.0), held, 10.0, 60.0)
        assert plan.rewarm_questions == ["why?"] and plan.rewarm_hold
        unheld = plan_prefix_op(op, state(), held, 10.0, 60.0)
        assert unheld.rewarm_questions == ["why?"] and not unheld.rewarm_hold


class TestPlacement:
    def test_longest_shared_prefix_wins(self):
        ws = [worker("w1", prefixes=[H1]), worker("w2", used=0, prefixes=[H2])]
        assert choose_worker(ws, [H1, H2, H3]) == "w2"

    def test_above_threshold_never_chosen(self):
        ws = [worker("w1", used=71, prefixes=[H1]), worker("w2", used=50)]
        assert choose_worker(ws, [H1]) == "w2"

    def test_evictable_memory_does_not_block_warmup(self):
        ws = [worker("w1", used=95, pinned=20), worker("w2", used=60, pinned=71)]
        assert choose_worker(ws, [H1]) == "w1"

    def test_not_ready_never_chosen(self):
        assert choose_worker([worker("w1", ready=False)], [H1]) is None

    @given(st.lists(st.integers(0, 100), min_size=1, max_size=6))
    def test_cold_choice_is_least_loaded(self, used):
        ws = [worker(f"w{i}", used=u) for i, u in enumerate(used)]
        chosen = choose_worker(ws, [H1])
        eligible = [w for w in ws if w.mem_ratio <= 0.7]
        if not eligible:
            assert chosen is None
        else:
            assert next(w for w in ws if w.worker_id == chosen).mem_used == min(
                w.mem_used for w in eligible
            )


class TestWorkerEvents:
    def test_stored_and_invalidated_update_prefixes(self):
        ws = apply_worker_event(
            None, WorkerEvent(worker_id="w", kind="ready", url="http://x", mem_total_bytes=100), 1.0
        )
        ws = apply_worker_event(ws, WorkerEvent(worker_id="w", kind="stored", prefix_hash=P1), 2.0)
        assert ws.prefixes == [P1] and ws.ready and ws.url == "http://x"
        ws = apply_worker_event(
            ws, WorkerEvent(worker_id="w", kind="invalidated", prefix_hash=P1), 3.0
        )
        assert ws.prefixes == []
        ws = apply_worker_event(ws, WorkerEvent(worker_id="w", kind="stopped"), 4.0)
        assert not ws.ready

    def test_a_heartbeat_reports_what_the_kv_tier_holds(self):
        beat = WorkerEvent(worker_id="w", kind="heartbeat", mem_total_bytes=100, tier_bytes=512)
        assert apply_worker_event(None, beat, 1.0).tier_bytes == 512


class TestHotSet:
    def test_budget_and_min_count(self):
        ranked = [
            HotCandidate(P1, 10, 100),
            HotCandidate(P2, 5, 1000),
            HotCandidate(H1, 4, 50),
            HotCandidate(H2, 1, 10),
        ]
        hot, cooled = plan_hot_set(ranked, budget_bytes=200, bytes_per_token=1, previously_hot=[H3])
        assert hot == [P1, H1] and cooled == [H3]

    @given(
        st.lists(st.tuples(st.floats(0, 100), st.integers(1, 500)), max_size=30),
        st.integers(0, 5000),
    )
    def test_hot_set_never_exceeds_budget(self, items, budget):
        ranked = [HotCandidate(f"{i:032x}", c, t) for i, (c, t) in enumerate(items)]
        hot, _ = plan_hot_set(ranked, budget, 1, [])
        size = {c.prefix_hash: aligned_tokens(c.tokens) for c in ranked}  # what a worker stores
        assert sum(size[h] for h in hot) <= budget and all(size[h] > 0 for h in hot)


class TestHeavyHitters:
    def test_space_saving_keeps_frequent_keys(self):
        sketch = SpaceSaving(capacity=3)
        for key in ["a"] * 50 + list("bcdefghij") + ["a"] * 10:
            sketch.add(key)
        assert max(sketch.counts, key=sketch.counts.get) == "a"
        assert len(sketch.counts) == 3

    @given(st.lists(st.sampled_from("abcdefghijklmnop"), max_size=300), st.integers(1, 8))
    def test_space_saving_bounds(self, keys, capacity):
        sketch = SpaceSaving(capacity)
        for k in keys:
            sketch.add(k)
        assert len(sketch.counts) <= capacity
        assert sum(sketch.counts.values()) == pytest.approx(len(keys))
        for k, c in sketch.counts.items():
            assert c >= keys.count(k)  # Space-Saving never underestimates a tracked key


def test_link_of_prefix_built_from_replaced_chunk_invalidates_it():
    from streams.decide.logic import plan_doc_link

    doc = DocState(version=2, chunks={"d.md#0": H3})
    link = DocLink(doc_id="d.md", prefix_hash=P1, chunk_refs=[ref("d.md#0", H1)])
    links, op = plan_doc_link({}, link, doc)
    assert P1 in links and op.op == "invalidate" and op.prefix_hash == P1
    _, op = plan_doc_link(
        {}, DocLink(doc_id="d.md", prefix_hash=P2, chunk_refs=[ref("d.md#0", H3)]), doc
    )
    assert op is None


def test_edit_elsewhere_in_the_document_rechecks_the_valid_prefix():
    prior = DocState(version=1, chunks={"d.md#0": H1, "d.md#1": H2})
    deps = {P1: [ref("d.md#0", H1)]}
    edit = plan_kb_change(upsert(2), prior, {"d.md#0": H1, "d.md#1": H3}, deps, 0.0)
    assert [(op.op, op.recheck) for op in edit.ops] == [("extend_ttl", True)]
    same = plan_kb_change(upsert(3), prior, {"d.md#0": H1, "d.md#1": H2}, deps, 0.0)
    assert [(op.op, op.recheck) for op in same.ops] == [("extend_ttl", False)]

    plan = plan_prefix_op(edit.ops[0], state(hot=True), [], 0.0, 60.0)
    assert plan.rewarm_questions == ["why?"] and plan.rewarm_pin
    plan = plan_prefix_op(same.ops[0], state(), [], 0.0, 60.0)
    assert plan.rewarm_questions == []


class TestRewarm:
    def test_most_used_prefixes_first_within_the_budget(self):
        tracked = [
            ("old", state(expires_at=5.0, updated_at=4.0)),  # expired at now=10
            ("recent", state(expires_at=50.0, updated_at=9.0)),
            ("popular", state(expires_at=50.0, updated_at=1.0)),
            ("big", state(expires_at=50.0, updated_at=8.0, token_ids=[1] * 64)),
            ("hot", state(expires_at=50.0, updated_at=9.5)),
        ]
        chosen = plan_rewarm(tracked, 10.0, 70, 1, skip={"hot"}, counts={"popular": 3.0})
        # 32 + 32 tokens fit in 70 bytes; "big" (64) no longer fits after them.
        assert chosen == ["popular", "recent"]

    def test_a_large_prefix_is_skipped_and_smaller_ones_still_fit(self):
        tracked = [
            ("big", state(expires_at=50.0, updated_at=9.0, token_ids=[1] * 64)),
            ("small", state(expires_at=50.0, updated_at=1.0)),
        ]
        assert plan_rewarm(tracked, 0.0, 40, 1) == ["small"]

    def test_an_expired_prefix_asked_often_comes_before_a_recent_one_asked_once(self):
        tracked = [
            ("yesterday", state(expires_at=5.0, updated_at=1.0, uses=9)),
            ("today", state(expires_at=50.0, updated_at=9.0, uses=1)),
        ]
        assert plan_rewarm(tracked, 10.0, 32, 1) == ["yesterday"]
        assert plan_rewarm(tracked, 10.0, 64, 1) == ["yesterday", "today"]

    def test_uses_and_the_window_count_add_up(self):
        """Asked all day outranks asked once lately; lately still tips a near tie."""
        tracked = [
            ("steady", state(expires_at=50.0, updated_at=1.0, uses=9)),
            ("burst", state(expires_at=50.0, updated_at=9.0, uses=2)),
            ("recent", state(expires_at=50.0, updated_at=8.0, uses=3)),
            ("older", state(expires_at=50.0, updated_at=2.0, uses=4)),
        ]
        counts = {"burst": 1.0, "recent": 2.0}
        assert plan_rewarm(tracked, 10.0, 32 * 4, 1, counts=counts) == [
            "steady", "recent", "older", "burst"]


def test_a_query_op_counts_a_use_and_other_warms_do_not():
    query = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32, question="why?",
                     reason="query")
    first = plan_prefix_op(query, None, [], 0.0, 60.0).state
    assert first is not None and first.uses == 1
    again = plan_prefix_op(query, first, [], 1.0, 60.0).state
    assert again is not None and again.uses == 2
    hot = plan_prefix_op(query.model_copy(update={"reason": "hot"}), again, [], 2.0, 60.0).state
    assert hot is not None and hot.uses == 2


class TestLostPrefill:
    def test_a_prefill_never_reported_is_sent_again_after_the_wait(self):
        op = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32, question="why?")
        workers = [worker("w1")]
        first = plan_prefix_op(op, None, workers, 0.0, 600.0)
        assert [c.op for c in first.commands] == ["prefill"]
        # Ops keep arriving (queries, hot ticks) while the worker has not reported it held:
        state = first.state
        for now in (5.0, 10.0, 20.0, 29.0):
            plan = plan_prefix_op(op, state, workers, now, 600.0)
            assert plan.commands == []
            state = plan.state
        # ... they do not push the wait forward: past it, the prefill is sent again.
        again = plan_prefix_op(op, state, workers, 31.0, 600.0)
        assert [c.op for c in again.commands] == ["prefill"]

    def test_a_prefix_never_prefilled_is_not_waited_for_at_any_clock(self):
        # The benchmark's clock starts at 0: "never sent" must not read as "sent at 0".
        op = PrefixOp(op="warm", prefix_hash=P1, token_ids=[5] * 32)
        plan = plan_prefix_op(op, state(), [worker("w1")], 5.0, 600.0)
        assert [c.op for c in plan.commands] == ["prefill"]


def test_an_edit_invalidates_only_prefixes_built_from_the_changed_chunk():
    """Issue 14, edit 8 of the default pipeline benchmark: invalidation commands carried
    every ref of the prefix, so a worker also dropped valid prefixes sharing one of its
    unchanged chunks; the next edit to such a prefix then invalidated nothing on any
    worker, and nothing re-warmed it. Now a command names only the stale refs."""
    from streams.decide.logic import plan_doc_link
    from workers.kv.blocks import block_hashes
    from workers.kv.cache import Budget, PrefixCache

    prior = DocState(version=1, chunks={"d.md#0": H1, "d.md#1": H2})
    shared = ref("d.md#1", H2)  # unchanged; in both prefixes
    deps = {P1: [ref("d.md#0", H1), shared]}
    (op,) = plan_kb_change(upsert(2), prior, {"d.md#0": H3, "d.md#1": H2}, deps, 0.0).ops
    assert op.op == "invalidate" and op.chunk_refs == [ref("d.md#0", H1)]
    full = state(chunk_refs=[ref("d.md#0", H1), shared, ref("e.md#0", H1)])
    (cmd,) = plan_prefix_op(op, full, [], 0.0, 60.0).commands
    assert cmd.chunk_refs == [ref("d.md#0", H1)]

    cache = PrefixCache(Budget(1000, 10, 500))
    keys = [[("d.md#0", H1), ("d.md#1", H2)], [("d.md#1", H2), ("x.md#0", H3)]]
    for n, refs in enumerate(keys):
        hashes = block_hashes([n] * 16, tenant="default", model="m")
        cache.admit(tenant="default", hashes=hashes, nbytes=1, chunk_refs=refs)
    removed = cache.invalidate([(r.chunk_id, r.content_hash) for r in cmd.chunk_refs])
    assert len(removed) == 1 and len(cache) == 1  # the prefix sharing d.md#1 stays

    link = DocLink(doc_id="d.md", prefix_hash=P2, chunk_refs=[ref("d.md#0", H1), shared])
    _, stale = plan_doc_link({}, link, DocState(version=2, chunks={"d.md#0": H3, "d.md#1": H2}))
    assert stale is not None and stale.chunk_refs == [ref("d.md#0", H1)]
