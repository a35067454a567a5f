"""Request caching per block (`workers.kv.request_blocks`): eviction takes a prompt's last
blocks first, a hit touches every block along the match, warm entries keep their rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.cache_kit import Clock, chain
from workers.kv.cache import Budget, PrefixCache
from workers.kv.request_blocks import BlockRequestCache, make_prefix_cache
from workers.kv.sizing import cache_for
from workers.settings import WorkerSettings

BLOCK_BYTES = 10  # every block of these tests holds 10 bytes of KV


def block_cache(max_blocks: int, *, policy: str = "slru", max_entries: int = 100
                ) -> tuple[BlockRequestCache, Clock]:
    clock = Clock()
    budget = Budget(max_blocks * BLOCK_BYTES, max_entries, max_blocks * BLOCK_BYTES)
    cache = BlockRequestCache(budget, policy=policy, clock=clock)
    return cache, clock


def ask(cache: PrefixCache, *blocks: int) -> int:
    """A request as an engine serves it: look up, then store the prompt; blocks matched."""
    hashes = chain(*blocks)
    _, matched = cache.lookup(hashes)
    cache.admit(tenant="t1", hashes=hashes, nbytes=len(hashes) * BLOCK_BYTES, kind="request")
    return matched


def cached(cache: PrefixCache, *blocks: int) -> int:
    return cache.peek(chain(*blocks))[1]


def test_a_prompt_is_stored_as_one_entry_per_leading_run_of_its_blocks():
    cache, _ = block_cache(10)
    entry, evicted = cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30, kind="request")
    assert evicted == [] and entry.block_hashes == tuple(chain(1, 2, 3))
    assert sorted(e.n_blocks for e in cache.entries()) == [1, 2, 3]
    assert cache.bytes_used == 30  # the runs share the prompt's blocks


def test_eviction_takes_a_prompts_last_blocks_first():
    cache, _ = block_cache(6)
    ask(cache, 1, 2, 3, 4)
    ask(cache, 7, 8, 9, 10)  # 8 blocks asked of room for 6: two must go, the oldest prompt's tail
    assert cached(cache, 1, 2, 3, 4) == 2
    assert cached(cache, 7, 8, 9, 10) == 4


def test_a_per_entry_cache_also_frees_only_the_tail_it_needs():
    clock = Clock()
    cache = PrefixCache(Budget(60, 100, 60), policy="slru", clock=clock)
    ask(cache, 1, 2, 3, 4)
    ask(cache, 7, 8, 9, 10)
    assert cached(cache, 1, 2, 3, 4) == 2  # its head stays as a request entry
    assert sorted(e.n_blocks for e in cache.entries()) == [2, 4]


def test_a_hit_touches_every_block_along_the_match_and_not_the_tail():
    cache, clock = block_cache(8, policy="lru")
    ask(cache, 1, 2, 5, 6)  # a shared head (1, 2) and its own tail
    clock.t += 1
    ask(cache, 9, 10, 11)
    clock.t += 1
    assert ask(cache, 1, 2, 7) == 2  # the head is hit: it is now the most recent
    clock.t += 1
    ask(cache, 20, 21, 22)  # 10 blocks of room 8: the least recent go, tail first
    assert cached(cache, 1, 2, 5, 6) == 2  # the head outlived its old tail
    assert cached(cache, 1, 2, 7) == 3


def test_warm_entries_keep_their_rules_and_get_no_runs():
    cache, _ = block_cache(10)
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True)
    cache.admit(tenant="t1", hashes=chain(1, 2, 3, 4), nbytes=40, kind="request")
    # Runs only past the pinned head: (1,2,3) and the prompt; none under the pin.
    assert sorted((e.n_blocks, e.pinned) for e in cache.entries()) == [
        (2, True), (3, False), (4, False)]
    managed, _ = cache.admit(tenant="t1", hashes=chain(5, 6), nbytes=20, ttl_s=60.0)
    assert managed.managed and len(cache) == 4  # a warmup stores one entry, as before


def test_a_request_under_an_evictable_warm_entry_still_gets_its_runs():
    cache, _ = block_cache(10)
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, ttl_s=60.0)  # unpinned, TTL'd
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30, kind="request")
    # The warm entry may be evicted: the request's head (1) is its own eviction unit.
    assert sorted((e.n_blocks, e.managed) for e in cache.entries()) == [
        (1, False), (2, True), (3, False)]


def test_a_run_keeps_the_chunk_refs_that_start_in_it():
    cache, _ = block_cache(10)
    refs = {("c1", "h1"): 0, ("c2", "h2"): 32}  # c2 starts in the third block
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30, kind="request",
                chunk_refs=refs, chunk_starts=refs)
    runs = {e.n_blocks: e.chunk_refs for e in cache.entries()}
    assert runs[2] == {("c1", "h1")} and runs[3] == set(refs)
    # A change to c2 cuts from its block: the head before it stays cached.
    cache.invalidate([("c2", "h2")])
    assert cached(cache, 1, 2, 3) == 2


def test_the_entry_cap_evicts_runs_tail_first_and_never_refuses_the_prompt():
    cache, _ = block_cache(100, max_entries=3)
    entry, _ = cache.admit(tenant="t1", hashes=chain(1, 2, 3, 4, 5), nbytes=50, kind="request")
    assert len(cache) == 3
    assert cached(cache, 1, 2, 3, 4, 5) == 3  # the prompt's last blocks went for its head
    assert entry.n_blocks == 5


def test_request_caching_is_chosen_by_name_and_by_the_worker_setting():
    budget = Budget(100, 10, 100)
    assert type(make_prefix_cache("block", budget)) is BlockRequestCache
    assert type(make_prefix_cache("entry", budget)) is PrefixCache
    with pytest.raises(ValueError, match="valid names: block, entry"):
        make_prefix_cache("blocks", budget)
    assert type(cache_for(WorkerSettings(), None)) is PrefixCache  # the default: entry
    block_settings = WorkerSettings(request_caching="block")
    assert isinstance(cache_for(block_settings, None), BlockRequestCache)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=6), min_size=1, max_size=25))
def test_bytes_never_exceed_the_budget_and_every_run_is_whole(prompts: list[list[int]]):
    cache, clock = block_cache(8)
    for prompt in prompts:
        clock.t += 1
        ask(cache, *prompt)
        assert cache.bytes_used <= 8 * BLOCK_BYTES
        for entry in cache.entries():  # an entry's blocks are all in the pool
            assert all(h in cache.pool for h in entry.block_hashes)
        assert cached(cache, *prompt) >= 1  # the newest prompt's head is always kept
