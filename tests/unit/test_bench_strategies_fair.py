"""The fair bench: one eviction for all, warmup that costs simulated time, per-block request
caching for `reactive`, `history` in its best form, and the drawn workload beside the
post-edit scenario."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from ragwarm.bench.strategies import workload as wl
from ragwarm.bench.strategies.lanes import SimClock
from ragwarm.bench.strategies.policies import History, PolicyContext, Reactive, policy_class
from ragwarm.trace import Question, TraceEvent
from schemas import WarmupCommand
from streams.handle.ports import WarmPrefix
from workers.cost_engine import CostEngine, CostModel, make_cache
from workers.kv.memory import Budget
from workers.sim import SimWorker

BLOCK = 16
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def worker(clock: SimClock, *, max_bytes: int = 10**9, block_level: bool = False,
           policy: str = "lru") -> SimWorker:
    cache = make_cache(Budget(max_bytes, 1000, max_bytes), clock, BLOCK, policy,
                       "block" if block_level else "entry")
    engine = CostEngine(CostModel(100.0, 1.0), cache, model_id="m", kv_bytes_per_token=1)
    return SimWorker(engine, clock, worker_id="w", cache_requests=True)


def prefill(w: SimWorker, tokens: list[int]) -> str:
    return w.apply(WarmupCommand(command_id="c", op="prefill", worker_id="w", prefix_hash="ab" * 8,
                                 tenant="t", token_ids=tokens, pin=False, reason="test"))


def test_reactive_caches_per_block_and_the_streams_policies_as_ragwarms_worker_does():
    assert Reactive.request_caching("entry") == "block"
    assert policy_class("reactive-offload").request_caching("block") == "entry"
    for name in ("scheduled", "history", "event-rag", "hybrid"):
        assert policy_class(name).request_caching("block") == "block"
        assert policy_class(name).request_caching("entry") == "entry"


def test_every_policy_evicts_as_ragwarms_worker_unless_told_otherwise():
    for name in ("none", "reactive", "scheduled", "history", "event-rag", "hybrid"):
        assert policy_class(name).eviction_on("slru") == "slru"
    assert Reactive.eviction_on("slru", same=False) == "lru"  # vLLM's own
    assert policy_class("hybrid").eviction_on("slru", same=False) == "slru"


def test_a_request_waits_behind_the_prefill_its_worker_is_computing():
    clock = SimClock()
    w = worker(clock)
    assert prefill(w, list(range(1000, 1100))) == "stored"
    # 100 tokens on the cost model: 100 ms + 100 ms; the worker is busy until t=0.2.
    assert w.busy_until == 0.2 and w.busy_seconds == 0.2
    clock.now = 0.05
    answer = w.serve(list(range(100)), "t", [])
    assert answer.queued_s == pytest.approx(0.15)
    assert answer.ttft_s == pytest.approx(answer.result.ttft_s + 0.15)
    clock.now = 1.0
    assert w.serve(list(range(200, 300)), "t", []).queued_s == 0.0


def test_a_request_goes_before_the_queued_prefills_not_before_the_one_under_way():
    clock = SimClock()
    w = worker(clock)
    for first in (1000, 2000, 3000):  # three prefills of 0.2 s queued back to back
        prefill(w, list(range(first, first + 100)))
    assert w.busy_until == pytest.approx(0.6)
    clock.now = 0.1
    answer = w.serve(list(range(100)), "t", [])
    assert answer.queued_s == pytest.approx(0.1)  # the rest of the first prefill only
    # The two queued prefills run after the request's own 0.2 s of compute.
    assert w.busy_until == pytest.approx(0.6 + answer.result.ttft_s)


def test_a_prefill_of_what_is_cached_costs_nothing_and_warmup_before_traffic_is_free():
    clock = SimClock()
    w = worker(clock)
    prefill(w, list(range(100)))
    w.idle()  # the worker reports ready only after its first warmup
    assert w.serve(list(range(100)), "t", []).queued_s == 0.0
    before = w.busy_seconds
    assert prefill(w, list(range(96))) == "already_cached"
    assert w.busy_seconds == before


def test_warmup_seconds_are_the_cost_models_not_the_bookkeepings_wall_time():
    clock = SimClock()
    w = worker(clock)
    prefill(w, list(range(100)))  # 100 ms + 100 tokens x 1 ms
    assert prefill(w, list(range(96))) == "already_cached"  # nothing computed
    prefill(w, list(range(200, 300)))
    assert w.warm_seconds == pytest.approx(0.4) and w.busy_seconds == pytest.approx(0.4)


def test_per_block_caching_evicts_a_prompts_tail_first_and_keeps_its_head():
    clock = SimClock()
    # Room for 8 blocks of 16 tokens at one byte a token.
    w = worker(clock, max_bytes=8 * BLOCK, block_level=True)
    a = list(range(100))  # 6 full blocks
    w.serve(a, "t", [])
    assert len(w.cache) == 6  # one entry per leading run of blocks
    clock.now = 1.0
    w.serve(list(range(500, 564)), "t", [])  # 4 blocks: two of a's must go
    # The tail went first: a's first four blocks still serve it.
    assert w.expected_cached(a, "t") == 4 * BLOCK


def test_a_hit_touches_every_block_along_the_match():
    clock = SimClock()
    w = worker(clock, max_bytes=8 * BLOCK, block_level=True)
    shared = list(range(64))  # 4 blocks every prompt below opens with
    w.serve([*shared, *range(900, 932), 1], "t", [])  # 6 blocks
    clock.now = 1.0
    w.serve([*shared, 2], "t", [])  # a hit on the 4 shared blocks
    clock.now = 2.0
    w.serve(list(range(5000, 5064)), "t", [])  # 4 new blocks: 2 must go
    # The first prompt's unshared tail went, not the shared head it touched.
    assert w.expected_cached([*shared, 3], "t") == 4 * BLOCK


def test_entry_level_caching_keeps_one_entry_per_prompt():
    clock = SimClock()
    w = worker(clock)
    w.serve(list(range(100)), "t", [])
    assert len(w.cache) == 1


class _Rag:
    def __init__(self, prefixes: dict[str, list[int]]) -> None:
        self.prefixes = prefixes

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        ids = self.prefixes.get(question)
        return None if ids is None else WarmPrefix(question * 16, ids, [])

    def question_ids(self, question: str) -> list[int]:
        return [7000 + ord(question[0])] * 8


class _Question:
    def __init__(self, question: str) -> None:
        self.question = question


def test_history_fills_with_whole_prompts_most_asked_prefilled_last():
    clock = SimClock()
    w = worker(clock, max_bytes=3 * 48)  # three prompts of 48 tokens, at a byte a token
    rag = _Rag({"a": list(range(40)), "b": list(range(100, 140)), "c": list(range(200, 240)),
                "d": list(range(300, 340))})
    past = [_Question(x) for x in "abcd"]  # most asked first

    class Settings:
        tenant = "t"

    policy = History(PolicyContext(w, rag, Settings(), clock, past))  # type: ignore[arg-type]
    chosen = policy.chosen()
    assert [p.prefix_hash for p in chosen] == ["a" * 16, "b" * 16, "c" * 16]  # "d" does not fit
    assert all(len(p.token_ids) == 48 for p in chosen)  # prefix and question tail
    policy.start()
    assert len(w.cache) == 3
    full = {p.prefix_hash: w.expected_cached(p.token_ids, "t") for p in chosen}
    w.serve(list(range(5000, 5030)), "t", [])  # needs room: the least asked goes first
    held = {p.prefix_hash: w.expected_cached(p.token_ids, "t") for p in chosen}
    # The least asked lost its tail (only as much as the request needed), not the others.
    assert held["a" * 16] == full["a" * 16] and held["b" * 16] == full["b" * 16]
    assert 0 < held["c" * 16] < full["c" * 16]


def test_the_drawn_workload_moves_no_question():
    rng = random.Random(3)
    questions = [Question(qid=f"q{i}", question=f"what about q{i}?", doc_id=f"d{i}")
                 for i in range(20)]
    weights = wl.zipf_weights([x.qid for x in questions], 1.1, rng)
    arrivals = wl.arrivals(60, rng, 30.0, 0.08, (3, 8), 2.0)
    edits = [TraceEvent(seq=100 + i, timestamp=T0 + timedelta(minutes=i), op="upsert",
                        doc_id=f"d{i}", text=f"v{i}") for i in range(6)]
    drawn = wl.timeline(arrivals, edits, questions, weights, 99, random.Random(5),
                        post_edit_asks=False)
    forced = wl.timeline(arrivals, edits, questions, weights, 99, random.Random(5))
    assert [type(s) for s in drawn] == [type(s) for s in forced]
    assert drawn != forced  # the scenario moved some asks; the drawn workload keeps its own


def test_a_request_waits_for_the_pass_under_way_not_the_whole_long_prefill():
    clock = SimClock()
    w = worker(clock)
    w.pass_tokens = 100  # the engine yields between passes of 100 tokens
    assert prefill(w, list(range(1000, 1300))) == "stored"
    # 300 tokens: 100 ms + 300 ms in 3 passes of 0.4/3 s; busy until t=0.4.
    assert w.busy_until == pytest.approx(0.4)
    clock.now = 0.05
    answer = w.serve(list(range(100)), "t", [])
    assert answer.queued_s == pytest.approx(0.4 / 3 - 0.05)  # the rest of the first pass
    # The two passes left run after the request's own compute.
    assert w.busy_until == pytest.approx(0.4 + answer.result.ttft_s)
    clock.now = 0.4 / 3 + answer.result.ttft_s + 0.01  # inside the second pass
    assert w.serve(list(range(500, 600)), "t", []).queued_s == pytest.approx(0.4 / 3 - 0.01)


def test_the_apps_timers_fire_when_due_not_at_the_step_that_follows():
    from ragwarm.bench.strategies.streams_policy import _due_times

    # Hot tick every 5 s from 0, sweep every 60 s from 0; a step at 2.85 s runs both at 0,
    # so a warmup they send starts then (and is done before a request at 2.85 s).
    assert _due_times(0.0, 5.0, 0.0, 60.0, 2.85) == [(0.0, True), (0.0, False)]
    # Nothing due: nothing runs.
    assert _due_times(10.0, 5.0, 60.0, 60.0, 9.9) == []
    # After a long gap: each timer's first and last due times, in time order.
    assert _due_times(10.0, 5.0, 60.0, 60.0, 33.0) == [(10.0, True), (30.0, True)]
    assert _due_times(55.0, 5.0, 60.0, 60.0, 61.0) == [(55.0, True), (60.0, True),
                                                       (60.0, False)]


def test_a_timer_runs_at_its_due_time_and_the_clock_returns_to_the_step():
    clock = SimClock()
    clock.now = 7.0
    ctx = PolicyContext(worker(clock), None, None, clock, [])  # type: ignore[arg-type]
    seen = []
    with ctx.at(5.0):
        seen.append(ctx.clock())
    with ctx.at(9.0):  # never ahead of the step
        seen.append(ctx.clock())
    assert seen == [5.0, 7.0] and clock() == 7.0
