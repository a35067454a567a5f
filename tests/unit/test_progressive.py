"""Seed 000's router: "warmup_steps 3 (progressive)", "memory_threshold 0.7 (stop warming
above it)" — a ready worker's re-warm in growing steps, one per heartbeat."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import WorkerEvent
from streams.decide.progressive import WARMUP_STEPS, next_step, step_shares, wave
from streams.decide.records import PrefixState, WorkerState
from streams.handle import handlers
from streams.settings import StreamsSettings
from streams.sim import run_sync
from tests.unit.conftest import REFS, Port, pipeline


def test_three_growing_steps_by_default() -> None:
    assert WARMUP_STEPS == 3 == StreamsSettings().warmup_steps
    assert step_shares(3) == pytest.approx([1 / 6, 3 / 6, 1.0])
    assert step_shares(1) == [1.0]


def test_the_most_used_go_first_in_the_smallest_step() -> None:
    sizes = [(f"p{i}", 10) for i in range(10)]  # most used first, 100 bytes in all
    waves = [wave(sizes, 100, k, 3) for k in (1, 2, 3)]
    assert waves == [["p0"], ["p1", "p2", "p3", "p4"], ["p5", "p6", "p7", "p8", "p9"]]


def test_a_prefix_larger_than_the_first_step_waits_for_a_later_one() -> None:
    assert wave([("big", 60)], 100, 1, 3) == []
    assert wave([("big", 60)], 100, 3, 3) == ["big"]


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 5))
def test_the_steps_send_every_prefix_once_in_order(sizes: list[int], steps: int) -> None:
    named = [(f"p{i}", n) for i, n in enumerate(sizes)]
    budget = sum(sizes)  # the plan only chooses what fits the budget
    sent = [h for k in range(1, steps + 1) for h in wave(named, budget, k, steps)]
    assert sent == [h for h, _ in named]


def row(**update) -> WorkerState:
    base = WorkerState(worker_id="w", ready=True, mem_total=100, warm_step=2, warm_steps=3)
    return base.model_copy(update=update)


def test_the_next_step_waits_for_room_below_the_threshold() -> None:
    assert next_step(row(mem_used=70)) == 2  # at the threshold: still warms
    assert next_step(row(mem_used=71)) is None  # seed: stop warming above 0.7
    assert next_step(row(warm_step=0)) is None  # nothing pending
    assert next_step(row(ready=False)) is None


def tracked(p: handlers.HandlerDeps, n: int) -> list[str]:
    hashes = [f"{i:064x}" for i in range(1, n + 1)]
    for uses, prefix_hash in enumerate(hashes):
        state = PrefixState(
            tenant="default", chunk_refs=REFS, token_ids=[1] * 16, expires_at=1e9, uses=uses
        )
        p.tables.prefix_states[prefix_hash] = state
    return hashes[::-1]  # most used first


def heartbeat(used: int) -> WorkerEvent:
    return WorkerEvent(worker_id="w2", kind="heartbeat", mem_used_bytes=used,
                       mem_total_bytes=1920)


def test_a_ready_worker_is_warmed_in_three_steps_one_per_heartbeat() -> None:
    p, out = pipeline(Port({}), hot_tokens=False, kv_bytes_per_token=10)
    ranked = tracked(p, 12)  # 160 bytes each (one block), 1,920 bytes of room
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w2", kind="ready",
                                                     mem_total_bytes=1920)))
    steps = [sorted(o.prefix_hash for o in out.ops)]
    for used in (320, 960):
        out.ops.clear()
        run_sync(handlers.on_worker_event(p, heartbeat(used)))
        steps.append(sorted(o.prefix_hash for o in out.ops))
    # 1/6, 2/6 and 3/6 of 1,920 bytes: 2, 4 and 6 prefixes, most used first.
    assert steps == [sorted(ranked[:2]), sorted(ranked[2:6]), sorted(ranked[6:])]
    assert p.stats["warm_steps"] == 2
    out.ops.clear()
    run_sync(handlers.on_worker_event(p, heartbeat(1920)))  # done: nothing more
    assert out.ops == [] and p.stats["warm_steps_stopped"] == 0


def test_no_further_step_above_the_memory_threshold() -> None:
    p, out = pipeline(Port({}), hot_tokens=False, kv_bytes_per_token=10)
    tracked(p, 12)
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w2", kind="ready",
                                                     mem_total_bytes=1920)))
    out.ops.clear()
    run_sync(handlers.on_worker_event(p, heartbeat(1440)))  # 75% used: over 0.7
    run_sync(handlers.on_worker_event(p, heartbeat(160)))  # the rest is not sent later
    assert out.ops == [] and p.stats["warm_steps_stopped"] == 1


def test_a_restart_starts_the_steps_again() -> None:
    p, out = pipeline(Port({}), hot_tokens=False, kv_bytes_per_token=10)
    ranked = tracked(p, 12)
    for epoch in (1, 2):
        out.ops.clear()
        ready = WorkerEvent(worker_id="w2", kind="ready", epoch=epoch, mem_total_bytes=1920)
        run_sync(handlers.on_worker_event(p, ready))
        assert sorted(o.prefix_hash for o in out.ops) == sorted(ranked[:2])
