"""Unit tests for the block pool under the prefix cache: sharing, kinds, invalidation cuts."""

from __future__ import annotations

import pytest

from tests.unit.cache_kit import chain, make_cache
from workers.kv.block_pool import split_bytes
from workers.kv.cache import WarmupRefused

REF = ("doc#1", "aa")


def test_a_request_reuses_the_longest_chain_whoever_stored_it() -> None:
    cache, _ = make_cache()
    warm, _ = cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30, pin=True)
    request, _ = cache.admit(tenant="t1", hashes=chain(1, 2, 4, 5), nbytes=40, kind="request")
    # System prompt + first chunk (blocks 1, 2) come from either; block 3 only from the warm one.
    assert cache.lookup(chain(1, 2, 6))[1] == 2
    assert cache.lookup(chain(1, 2, 3, 7)) == (warm, 3)
    assert cache.lookup(chain(1, 2, 4, 5, 9)) == (request, 4)
    assert cache.bytes_used == 50 and cache.pinned_bytes == 30
    stats = cache.block_stats()
    assert (stats.blocks, stats.shared_blocks) == (5, 2)
    assert (stats.managed_blocks, stats.request_blocks) == (3, 2)
    assert (stats.managed_bytes, stats.request_bytes) == (30, 20)


def test_blocks_are_freed_only_with_their_last_holder() -> None:
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20)
    cache.admit(tenant="t1", hashes=chain(1, 3), nbytes=20, kind="request")
    cache.evict([chain(1, 2)[-1]])
    plan = cache.take_plan()
    assert plan.free == (chain(1, 2)[-1],) and plan.gone == (chain(1, 2)[-1],)
    assert chain(1)[-1] in cache.pool and cache.bytes_used == 20
    assert not cache.take_plan()  # each change is planned once
    cache.evict([chain(1, 3)[-1]])
    assert sorted(cache.take_plan().free) == sorted([chain(1)[-1], chain(1, 3)[-1]])
    assert cache.bytes_used == 0 and len(cache.pool) == 0


def test_a_plan_leaves_out_what_came_back_before_it_was_taken() -> None:
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20)
    cache.evict([chain(1, 2)[-1]])
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20)  # back before the engine looked
    assert not cache.take_plan()


def test_a_pinned_chain_leaves_only_unshared_room() -> None:
    cache, _ = make_cache(max_bytes=40, warm_bytes=40)
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True)
    request, _ = cache.admit(tenant="t1", hashes=chain(1, 3), nbytes=20, kind="request")
    assert cache.bytes_used == 30
    with pytest.raises(WarmupRefused):
        cache.admit(tenant="t1", hashes=chain(4, 5, 6), nbytes=30, kind="request")
    assert cache.bytes_used == 30 and len(cache) == 2
    _, evicted = cache.admit(tenant="t1", hashes=chain(4, 5), nbytes=20, kind="request")
    assert evicted == [request] and cache.bytes_used == 40
    assert chain(1)[-1] in cache.pool  # still held by the pinned entry


def test_a_request_over_a_warm_prefix_keeps_its_pin_lease_and_refs_and_adds_its_own() -> None:
    cache, clock = make_cache()
    warm, _ = cache.admit(
        tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True, ttl_s=50.0, chunk_refs=[REF]
    )
    clock.t += 10
    other = ("doc#2", "bb")
    again, _ = cache.admit(
        tenant="t1", hashes=chain(1, 2), nbytes=20, kind="request", chunk_refs=[other]
    )
    assert again.managed and again.pinned and again.chunk_refs == {REF, other}
    assert again.expires_at == warm.expires_at == 1050.0


def test_expiry_makes_managed_blocks_request_blocks() -> None:
    cache, clock = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True, ttl_s=5.0)
    clock.t += 5
    cache.expire()
    stats = cache.block_stats()
    assert (stats.managed_blocks, stats.request_blocks, stats.pinned_blocks) == (0, 2, 0)
    assert cache.bytes_used == 20


def test_invalidation_with_positions_frees_exactly_the_blocks_after_the_chunk() -> None:
    cache, _ = make_cache()
    # Chunk REF starts at token 40: blocks 0 and 1 precede it, block 2 on pass through it.
    warm, _ = cache.admit(
        tenant="t1",
        hashes=chain(1, 2, 3, 4),
        nbytes=40,
        chunk_refs=[REF],
        chunk_starts={REF: 40},
        pin=True,
    )
    request, _ = cache.admit(tenant="t1", hashes=chain(1, 2, 3, 5), nbytes=40, kind="request")
    cache.drain_events()
    removed = cache.invalidate([REF])
    assert removed == [warm, request]  # the request passes through the chunk too
    assert sorted(cache.take_plan().free) == sorted(chain(1, 2, 3, 4)[2:] + chain(1, 2, 3, 5)[3:])
    # Blocks 1, 2 stay, as a request entry ending there.
    kept = cache.get(chain(1, 2)[-1])
    assert kept is not None and kept.kind == "request" and cache.lookup(chain(1, 2, 9))[1] == 2
    events = [(e.kind, e.reason) for e in cache.drain_events()]
    assert events == [("stored", "truncated"), ("invalidated", "chunk_changed")] + [
        ("invalidated", "chunk_changed")
    ]
    assert cache.bytes_used == 20 and cache.pinned_bytes == 0


def test_a_block_a_changed_chunk_shares_with_another_chunks_opening_stays() -> None:
    # Two chunks of one document open with the same tokens (their ids' path): prompts with either
    # first share the block where both start (tokens 32-47) and fork after it.
    other = ("doc#2", "bb")
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2, 3, 4), nbytes=40, chunk_refs=[REF],
                chunk_starts={REF: 40}, pin=True)
    cache.admit(tenant="t1", hashes=chain(1, 2, 3, 5), nbytes=40, kind="request",
                chunk_refs=[other], chunk_starts={other: 40})
    removed = cache.invalidate([REF])
    assert [e.prefix_hash for e in removed] == [chain(1, 2, 3, 4)[-1]]
    assert cache.take_plan().free == (chain(1, 2, 3, 4)[-1],)  # only what the change alone marks
    assert cache.lookup(chain(1, 2, 3, 5))[1] == 4


def test_an_entry_naming_a_changed_chunk_leaves_though_its_last_block_is_shared() -> None:
    # The old version's prefix ends in the block both versions open with: no block of it is
    # doomed, yet it names the old version, so it leaves; its blocks stay with the new one.
    new = ("doc#1", "bb")
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30, chunk_refs=[REF],
                chunk_starts={REF: 40})
    cache.admit(tenant="t1", hashes=chain(1, 2, 3, 5), nbytes=40, chunk_refs=[new],
                chunk_starts={new: 40})
    removed = cache.invalidate([REF])
    assert [e.prefix_hash for e in removed] == [chain(1, 2, 3)[-1]]
    assert cache.get(chain(1, 2, 3)[-1]) is None and cache.lookup(chain(1, 2, 3, 5))[1] == 4
    assert all(REF not in e.chunk_refs for e in cache.entries())


def test_invalidation_without_positions_keeps_what_other_prompts_share() -> None:
    cache, _ = make_cache()
    # A warm prefix lists REF; a request shares its first two blocks and lists nothing.
    cache.admit(tenant="t1", hashes=chain(1, 2, 3, 4), nbytes=40, chunk_refs=[REF], pin=True)
    cache.admit(tenant="t1", hashes=chain(1, 2, 5), nbytes=30, kind="request")
    # And a request extending the warm prefix (its question) without listing REF.
    cache.admit(tenant="t1", hashes=chain(1, 2, 3, 4, 6), nbytes=50, kind="request")
    removed = cache.invalidate([REF])
    assert {e.prefix_hash for e in removed} == {chain(1, 2, 3, 4)[-1], chain(1, 2, 3, 4, 6)[-1]}
    assert cache.lookup(chain(1, 2, 3, 4))[1] == 2
    assert {b.block_hash for b in cache.pool.blocks()} == set(chain(1, 2, 5))


def test_invalidation_without_positions_and_nobody_sharing_frees_the_chain() -> None:
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, chunk_refs=[REF])
    assert len(cache.invalidate_chunks(["doc#1"])) == 1
    assert len(cache.pool) == 0 and len(cache) == 0


def test_invalidate_prefix_cuts_at_that_block() -> None:
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30, pin=True)
    removed = cache.invalidate_prefix(chain(1, 2)[-1])
    assert [e.prefix_hash for e in removed] == [chain(1, 2, 3)[-1]]
    assert {b.block_hash for b in cache.pool.blocks()} == set(chain(1))


def test_split_bytes_sums_exactly() -> None:
    assert split_bytes(10, 3) == [3, 3, 4] and sum(split_bytes(7, 7)) == 7
