"""A blended answer's blocks are kept, marked approximate (`Block.approx`): a hit reads
them, but they donate no chunk KV, so a blend is never built on a blend. They spill to a
tier and come back with their mark, and a tier's exact copy is never overwritten by one."""

from __future__ import annotations

from workers.kv.block_pool import Block, BlockPool, Holding
from workers.kv.blocks import BLOCK_SIZE
from workers.kv.cache import Budget, PrefixCache
from workers.kv.tier_index import TierBlock, TierIndex
from workers.kv.tier_journal import TierJournal, TierOps, absorb

BARE = Holding(pinned=False, managed=False)


def chain(tag: int, n: int) -> list[str]:
    return [f"{tag:02x}{i:02x}" * 8 for i in range(n)]


def test_new_blocks_from_the_blend_on_are_approximate_and_so_is_what_extends_them() -> None:
    pool = BlockPool()
    blocks = chain(1, 5)
    pool.hold("a", "t", blocks, [1] * 5, BARE, approx_from=2)
    assert [pool[h].approx for h in blocks] == [False, False, True, True, True]
    assert pool.exact_run(blocks) == 2
    # An exact prompt extending the blended one: its own new block extends approximate KV.
    longer = [*blocks, "ff" * 16]
    pool.hold("b", "t", longer, [1] * 6, BARE)
    assert pool["ff" * 16].approx and pool.exact_run(longer) == 2


def test_a_block_already_held_keeps_its_exact_kv_whoever_admits_it_blended() -> None:
    pool = BlockPool()
    blocks = chain(2, 4)
    pool.hold("exact", "t", blocks[:3], [1] * 3, BARE)
    pool.hold("blend", "t", blocks, [1] * 4, BARE, approx_from=1)
    assert [pool[h].approx for h in blocks] == [False, False, False, True]
    assert pool.exact_run(blocks) == 3 and pool.exact_run(["00" * 16]) == 0


def test_a_freed_approximate_block_comes_back_exact_when_computed_exactly() -> None:
    pool = BlockPool()
    blocks = chain(3, 2)
    pool.hold("blend", "t", blocks, [1, 1], BARE, approx_from=0)
    pool.release("blend", blocks, BARE)
    pool.hold("exact", "t", blocks, [1, 1], BARE)
    assert pool.exact_run(blocks) == 2 and not any(pool[h].approx for h in blocks)
    assert Block("x", 0, "t", 1).approx is False


def test_a_blended_prompt_spills_to_the_tier_with_its_marks() -> None:
    one = 4 * BLOCK_SIZE
    cache = PrefixCache(Budget(max_bytes=one, max_entries=10, warm_bytes=one))
    journal = TierJournal(write_through=False)
    cache.tier = journal
    blended = chain(4, 4)
    cache.admit(tenant="t", hashes=blended, nbytes=one, kind="request", approx_from=1)
    # Another prompt evicts it for room: it spills whole, its blended blocks marked. (Kept
    # out of the tier, a blended prompt was lost at each eviction, and re-blended at each
    # ask: `--standard` lost 4 of 240 hits that way; docs/lab/2026-12-06-blended-answers-stored.md.)
    cache.admit(tenant="t", hashes=chain(5, 4), nbytes=one, kind="request")
    index = TierIndex(8 * one)
    absorb(index, journal.drain(), set(blended))
    assert index.run(blended) == 4
    assert [index.get(h).approx for h in blended] == [False, True, True, True]


def tier_block(h: str, approx: bool) -> TierBlock:
    return TierBlock(h, None, "t", BLOCK_SIZE, approx=approx)


def test_a_tiers_exact_copy_is_never_overwritten_by_a_blend() -> None:
    h = chain(6, 1)[0]
    index = TierIndex(8 * BLOCK_SIZE)
    absorb(index, TierOps(writes={h: tier_block(h, False)}), {h})
    changes = absorb(index, TierOps(writes={h: tier_block(h, True)}), {h})
    assert changes.write == [] and index.get(h).approx is False


def test_exact_kv_written_over_a_tiers_blended_copy_replaces_it() -> None:
    h = chain(7, 1)[0]
    index = TierIndex(8 * BLOCK_SIZE)
    absorb(index, TierOps(writes={h: tier_block(h, True)}), {h})
    changes = absorb(index, TierOps(writes={h: tier_block(h, False)}), {h})
    assert changes.write == [h] and index.get(h).approx is False
