"""A ready worker's re-warm: it reaches every partition of the prefixes table, and counts each
prefix as the full blocks a worker stores (no Kafka)."""

from __future__ import annotations

from schemas import WorkerEvent
from streams.decide.records import PrefixOp, PrefixState, ReadyRewarm
from streams.handle import handlers as h
from streams.shell.agents import partition_of
from streams.sim import run_sync
from tests.unit.conftest import REFS, Port, pipeline

HASHES = [f"{i:064x}" for i in range(1, 13)]


def tracked(p: h.HandlerDeps) -> None:
    for n, prefix_hash in enumerate(HASHES):
        state = PrefixState(
            tenant="default", chunk_refs=REFS, token_ids=[1] * 20, expires_at=1e9, uses=n
        )
        p.tables.prefix_states[prefix_hash] = state


def test_each_partition_warms_only_its_own_prefixes_within_its_share() -> None:
    p, out = pipeline(Port({}), kv_bytes_per_token=1)
    p.partition_of = partition_of
    tracked(p)
    warmed: list[str] = []
    for k in range(4):
        out.ops.clear()
        req = ReadyRewarm(worker_id="w2", budget_bytes=10**6, partition=k, partitions=4)
        run_sync(h.on_ready_rewarm(p, req))
        assert {partition_of(o.prefix_hash, 4) for o in out.ops} <= {k}
        warmed += [o.prefix_hash for o in out.ops]
    assert sorted(warmed) == sorted(HASHES)  # every partition's together: all of them
    out.ops.clear()
    small = ReadyRewarm(worker_id="w2", budget_bytes=160, partition=0, partitions=4)
    run_sync(h.on_ready_rewarm(p, small))
    # A quarter of 160 bytes: two prefixes of 20 tokens, each stored as one 16-token block.
    assert len(out.ops) <= 2


def test_the_ready_event_asks_every_partition_once() -> None:
    p, out = pipeline(Port({}), hot_tokens=False)
    ready = WorkerEvent(worker_id="w2", kind="ready", epoch=1, mem_total_bytes=1000)
    run_sync(h.on_worker_event(p, ready))
    (req,) = out.readies
    assert req.worker_id == "w2" and req.partition is None and req.budget_bytes == 1000


def test_partition_of_spreads_keys_over_the_partitions() -> None:
    assert {partition_of(h, 4) for h in HASHES} == set(range(4))


def test_the_hot_sets_room_on_a_ready_worker_is_its_full_blocks() -> None:
    # A worker stores a prefix's full blocks only (`schemas.prefix.prefix_kv_bytes`): a
    # 20-token hot prefix takes one 16-token block, so the re-warm keeps 16 bytes for it.
    p, out = pipeline(Port({}), kv_bytes_per_token=1, hot_share=0.5, hot_tokens=False)
    p.tracker.hot["a" * 64] = PrefixOp(op="warm", prefix_hash="a" * 64, token_ids=[1] * 20)
    ready = WorkerEvent(worker_id="w2", kind="ready", epoch=1, mem_total_bytes=1000)
    run_sync(h.on_worker_event(p, ready))
    (req,) = out.readies
    assert req.budget_bytes == 1000 - 16


def test_a_progressive_steps_sizes_are_full_blocks() -> None:
    # Twelve 20-token prefixes in 2 steps within 96 bytes: the plan holds six of them, one
    # 16-token block each, and the first step fills a third of the budget (32 bytes): two
    # prefixes. Counted as 20 bytes each, the second would not fit it.
    p, out = pipeline(Port({}), kv_bytes_per_token=1)
    tracked(p)
    req = ReadyRewarm(worker_id="w2", budget_bytes=96, steps=2, step=1)
    run_sync(h.on_ready_rewarm(p, req))
    assert len(out.ops) == 2
