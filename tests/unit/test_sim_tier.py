"""The model-free cost engine keeps a host KV tier as the torch engine does (the same index
and journal, no tensors): evicted blocks spill there, a later hit reads them back at the
restore cost instead of recomputing them, and an edited chunk leaves the tier too."""

from __future__ import annotations

import pytest

from schemas import ChunkRef
from workers.cost_engine import CostEngine, CostModel
from workers.engines.protocol import GenerateRequest
from workers.kv.blocks import BLOCK_SIZE
from workers.kv.cache import Budget, PrefixCache, WarmupRefused
from workers.kv.chunk_kv import ChunkSpan
from workers.kv.tier_index import TierBlock, TierIndex
from workers.kv.tier_journal import TierJournal, TierOps, absorb
from workers.sim import SimWorker

COST = CostModel(100.0, 1.0, restore_per_token_ms=0.1)
N_BLOCKS = 4
REF_A = ("a#0", "v1")


def make_engine(tier_bytes: int) -> CostEngine:
    # The device holds one prompt of N_BLOCKS blocks (one byte per token).
    one = N_BLOCKS * BLOCK_SIZE
    cache = PrefixCache(Budget(max_bytes=one, max_entries=100, warm_bytes=one))
    return CostEngine(COST, cache, model_id="m", kv_bytes_per_token=1, tier_bytes=tier_bytes)


def prompt(first: int) -> list[int]:
    return [first + i for i in range(N_BLOCKS * BLOCK_SIZE + 5)]


def ask(engine: CostEngine, tokens: list[int], refs=()):
    request = GenerateRequest(tokens, max_tokens=1, tenant="t", cache_prompt=True,
                              chunk_refs=list(refs))
    return list(engine.generate(request))[-1].result


def test_an_evicted_prompt_comes_back_from_the_tier_at_the_restore_cost() -> None:
    engine = make_engine(tier_bytes=2 * N_BLOCKS * BLOCK_SIZE)
    a, b = prompt(1_000), prompt(2_000)
    assert ask(engine, a).cached_tokens == 0
    ask(engine, b)  # evicts a: its blocks spill to the tier
    assert engine.tier is not None and engine.tier.index.run(engine.block_hashes(a, tenant="t")) \
        == N_BLOCKS
    again = ask(engine, a)
    restored = N_BLOCKS * BLOCK_SIZE
    assert again.cached_tokens == restored
    expected_ms = COST.ttft_ms(len(a), restored) + COST.restore_per_token_ms * restored
    assert abs(again.ttft_s * 1000 - expected_ms) < 1e-6


def test_a_stored_blend_comes_back_from_the_tier_still_marked_approximate() -> None:
    engine = make_engine(tier_bytes=2 * N_BLOCKS * BLOCK_SIZE)
    a, b = prompt(1_000), prompt(2_000)
    hashes = engine.block_hashes(a, tenant="t")
    # As the engines store a blended answer: its blocks past the exact head marked.
    engine.cache.admit(tenant="t", hashes=hashes, nbytes=N_BLOCKS * BLOCK_SIZE,
                       kind="request", approx_from=1)
    ask(engine, b)  # evicts it: it spills with its marks
    again = ask(engine, a)
    assert again.cached_tokens == N_BLOCKS * BLOCK_SIZE
    assert again.approx_cached_tokens == (N_BLOCKS - 1) * BLOCK_SIZE
    assert engine.cache.pool.exact_run(hashes) == 1


def test_without_a_tier_the_evicted_prompt_is_recomputed() -> None:
    engine = make_engine(tier_bytes=0)
    a, b = prompt(1_000), prompt(2_000)
    ask(engine, a)
    ask(engine, b)
    assert engine.tier is None and ask(engine, a).cached_tokens == 0


def test_an_edited_chunk_leaves_the_tier_with_its_prompt() -> None:
    engine = make_engine(tier_bytes=2 * N_BLOCKS * BLOCK_SIZE)
    a, b = prompt(1_000), prompt(2_000)
    ask(engine, a, refs=[REF_A])
    ask(engine, b)
    engine.invalidate([REF_A], tenant="t")
    assert engine.tier is not None and len(engine.tier.index) == 0
    assert ask(engine, a).cached_tokens == 0


def test_a_host_tier_takes_evicted_blocks_only_and_a_disk_tier_warm_ones_too() -> None:
    for write_through, expected in ((False, 0), (True, N_BLOCKS)):
        journal = TierJournal(write_through=write_through)
        one = N_BLOCKS * BLOCK_SIZE
        cache = PrefixCache(Budget(max_bytes=2 * one, max_entries=10, warm_bytes=2 * one))
        cache.tier = journal
        hashes = [f"{i:02x}" * 16 for i in range(N_BLOCKS)]
        cache.admit(tenant="t", hashes=hashes, nbytes=one, ttl_s=60.0)  # a warmup
        index = TierIndex(4 * one)
        absorb(index, journal.drain(), set(hashes))
        assert len(index) == expected


def test_absorb_writes_a_block_once_and_unlinks_what_it_evicts_for_room() -> None:
    index = TierIndex(2)
    blocks = [TierBlock(f"{i:02x}" * 16, None, "t", 1) for i in range(3)]
    first = absorb(index, TierOps(spills={b.block_hash: b for b in blocks[:2]}), _ALL)
    assert first.write == [blocks[0].block_hash, blocks[1].block_hash] and not first.unlink
    again = absorb(index, TierOps(spills={blocks[0].block_hash: blocks[0]}), _ALL)
    assert again.write == [] and again.unlink == []  # held already: left as it is
    third = absorb(index, TierOps(spills={blocks[2].block_hash: blocks[2]}), _ALL)
    assert third.write == [blocks[2].block_hash] and third.evicted == [blocks[0].block_hash]


class _All:
    def __contains__(self, item: object) -> bool:
        return True


_ALL = _All()


def test_a_read_back_chunk_is_judged_by_its_last_block_not_its_shared_first() -> None:
    # Chunk c starts at token 20, inside block 1, whose tokens version 1 and version 2 share:
    # that block came to the tier with version 1's chain and keeps its mark. What the read
    # holds of c is the chain through c's last block, marked with version 2.
    engine = make_engine(tier_bytes=10 * N_BLOCKS * BLOCK_SIZE)
    worker = SimWorker(engine, lambda: 0.0, worker_id="w", cache_requests=True)
    tokens = prompt(1_000)
    hashes = engine.block_hashes(tokens, tenant="t")
    v1, v2 = ("c#0", "1" * 16), ("c#0", "2" * 16)
    ops = TierOps(writes={
        h: TierBlock(h, hashes[i - 1] if i else None, "t", BLOCK_SIZE,
                     frozenset() if i == 0 else frozenset({v1 if i == 1 else v2}))
        for i, h in enumerate(hashes)
    })
    assert engine.tier is not None
    absorb(engine.tier.index, ops, set(hashes))
    span = ChunkSpan(v2, 20, N_BLOCKS * BLOCK_SIZE)
    answer = worker.serve(tokens, "t", [ChunkRef(chunk_id=v2[0], content_hash=v2[1])],
                          spans=[span])
    assert answer.restored and answer.result.cached_tokens == N_BLOCKS * BLOCK_SIZE
    assert v1 not in answer.entry_refs and v2 in answer.entry_refs


def test_a_prefill_to_the_tier_leaves_device_memory_to_the_prompt_in_use() -> None:
    engine = make_engine(tier_bytes=2 * N_BLOCKS * BLOCK_SIZE)
    a, b = prompt(1_000), prompt(2_000)
    ask(engine, a)  # device memory is full with it
    used = engine.memory().used
    stored = engine.prefill(b, tenant="t", to_tier=True, command_id="c1")
    assert stored.computed_tokens == N_BLOCKS * BLOCK_SIZE
    b_hashes = engine.block_hashes(b, tenant="t")
    assert b_hashes[-1] not in engine.cache and engine.memory().used == used
    assert engine.block_hashes(a, tenant="t")[-1] in engine.cache  # nothing evicted for it
    assert b_hashes[-1] in engine.tier_state()[0]
    kinds = [(e.kind, e.reason) for e in engine.cache.drain_events() if e.command_id == "c1"]
    assert kinds == [("stored", ""), ("evicted", "tier")]
    assert ask(engine, b).cached_tokens == N_BLOCKS * BLOCK_SIZE  # read back on its ask


def test_a_prefill_to_the_tier_of_a_prefix_in_device_memory_keeps_it_there() -> None:
    engine = make_engine(tier_bytes=2 * N_BLOCKS * BLOCK_SIZE)
    a = prompt(1_000)
    ask(engine, a)
    assert engine.prefill(a, tenant="t", to_tier=True).computed_tokens == 0
    assert engine.block_hashes(a, tenant="t")[-1] in engine.cache
    head = a[: 2 * BLOCK_SIZE]  # its blocks are held by the longer prompt
    assert engine.prefill(head, tenant="t", to_tier=True).computed_tokens == 0
    assert engine.block_hashes(head, tenant="t")[-1] in engine.cache
    assert engine.tier_state() == ([], 0)


def test_a_worker_without_a_tier_refuses_a_tier_placement() -> None:
    engine = make_engine(tier_bytes=0)
    with pytest.raises(WarmupRefused, match="no KV tier"):
        engine.prefill(prompt(1_000), tenant="t", to_tier=True)
    assert engine.tier_total() == 0 and len(engine.cache) == 0


def test_an_edited_chunk_reaches_a_prefix_placed_in_the_tier() -> None:
    engine = make_engine(tier_bytes=2 * N_BLOCKS * BLOCK_SIZE)
    b = prompt(2_000)
    engine.prefill(b, tenant="t", chunk_refs=[REF_A], to_tier=True)
    assert engine.tier_total() == 2 * N_BLOCKS * BLOCK_SIZE
    engine.invalidate([REF_A], tenant="t")
    engine.sync()
    assert engine.tier is not None
    assert engine.tier.index.run(engine.block_hashes(b, tenant="t")) == 0
    assert ask(engine, b).cached_tokens == 0


def _worker(tier_bytes: int) -> tuple[SimWorker, list]:
    """A simulated worker and the `worker.events` it sends from now on."""
    worker = SimWorker(make_engine(tier_bytes), lambda: 0.0, worker_id="w", cache_requests=True)
    events: list = []
    worker.listeners.append(events.append)
    return worker, events


def test_a_tier_placement_command_is_stored_in_the_tier_and_reported() -> None:
    from schemas import WarmupCommand

    worker, events = _worker(tier_bytes=2 * N_BLOCKS * BLOCK_SIZE)
    cmd = WarmupCommand(command_id="c1", op="prefill", token_ids=prompt(2_000), tenant="t",
                        placement="tier")
    assert worker.apply(cmd) == "stored"
    # Stored, then gone from device memory: routers see it only in the tier's list.
    assert [e.kind for e in events if e.command_id == "c1"] == ["stored", "evicted"]
    beat = worker.runtime.status_event("heartbeat")
    assert beat.tier_total_bytes == 2 * N_BLOCKS * BLOCK_SIZE and beat.warm_prefixes == []
    assert beat.tier_prefixes == [worker.engine.block_hashes(prompt(2_000), tenant="t")[-1]]


def test_a_worker_without_a_tier_refuses_a_tier_placement_command_with_its_reason() -> None:
    from schemas import WarmupCommand

    worker, events = _worker(tier_bytes=0)
    cmd = WarmupCommand(command_id="c1", op="prefill", token_ids=prompt(2_000), tenant="t",
                        placement="tier")
    assert worker.apply(cmd) == "refused"
    [refused] = [e for e in events if e.kind == "refused"]
    assert refused.command_id == "c1" and "no KV tier" in (refused.reason or "")
    assert worker.runtime.status_event("heartbeat").tier_total_bytes == 0
