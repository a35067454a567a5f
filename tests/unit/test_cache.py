"""Unit tests for the pure prefix cache: hashing, lookup, admission, removal, events."""

from __future__ import annotations

import hashlib
import struct

import pytest

from tests.unit.cache_kit import Clock, chain, make_cache
from workers.kv.blocks import BLOCK_SIZE, block_hashes, root_hash
from workers.kv.cache import Budget, CacheEntry, PrefixCache, WarmupRefused

# -- hashing -------------------------------------------------------------------------


def test_only_full_blocks_are_hashed() -> None:
    assert block_hashes(list(range(15)), tenant="t", model="m") == []
    assert len(block_hashes(list(range(33)), tenant="t", model="m")) == 2
    assert len(block_hashes(list(range(32)), tenant="t", model="m")) == 2


def test_hash_follows_the_documented_formula() -> None:
    ids = list(range(40, 72))
    parent = bytes.fromhex(root_hash("t", "m"))
    expected = []
    for start in (0, 16):
        digest = hashlib.sha256(parent + struct.pack("<16I", *ids[start : start + 16]))
        expected.append(digest.hexdigest()[:32])
        parent = bytes.fromhex(expected[-1])
    assert block_hashes(ids, tenant="t", model="m") == expected


def test_chain_is_prefix_stable_and_position_sensitive() -> None:
    assert chain(1, 2, 3)[:2] == chain(1, 2)
    # Same block after a different parent gets a different hash.
    assert chain(1, 2)[1] != chain(3, 2)[1]
    assert all(len(h) == 32 and int(h, 16) >= 0 for h in chain(1, 2))


def test_tenant_and_model_salt_the_root() -> None:
    a = set(chain(1, 2, tenant="a"))
    assert a.isdisjoint(chain(1, 2, tenant="b"))
    assert a.isdisjoint(chain(1, 2, tenant="a", model="other"))
    assert root_hash("a|b", "c") != root_hash("a", "b|c")


def test_block_size_and_token_range() -> None:
    assert len(block_hashes(list(range(10)), tenant="t", model="m", block_size=4)) == 2
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1], tenant="t", model="m", block_size=0)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        block_hashes([-1] * 16, tenant="t", model="m")
    with pytest.raises(ValueError, match="2\\*\\*32"):
        block_hashes([2**32] * 16, tenant="t", model="m")


# -- admission -----------------------------------------------------------------------


def test_admit_stores_and_records_event() -> None:
    cache, clock = make_cache()
    h = chain(1, 2)
    entry, evicted = cache.admit(
        tenant="t1", hashes=h, nbytes=100, chunk_refs=[("d#0", "aa")], command_id="c1"
    )
    assert evicted == []
    assert entry.prefix_hash == h[-1] and entry.n_tokens == 32 and entry.n_blocks == 2
    assert entry.expires_at == clock.t + 3600.0 and not entry.pinned
    assert len(cache) == 1 and h[-1] in cache and cache.get(h[-1]) is entry
    assert cache.bytes_used == 100 and cache.pinned_bytes == 0
    (event,) = cache.drain_events()
    assert (event.kind, event.prefix_hash, event.command_id) == ("stored", h[-1], "c1")
    assert event.chunk_refs == frozenset({("d#0", "aa")}) and event.nbytes == 100
    assert cache.drain_events() == []


def test_admit_rejects_bad_arguments() -> None:
    cache, _ = make_cache()
    with pytest.raises(ValueError, match="at least one"):
        cache.admit(tenant="t1", hashes=[], nbytes=1)
    with pytest.raises(ValueError, match="nbytes"):
        cache.admit(tenant="t1", hashes=chain(1), nbytes=-1)
    cache.admit(tenant="t1", hashes=chain(1), nbytes=1)
    with pytest.raises(ValueError, match="tenant"):
        cache.admit(tenant="other", hashes=chain(1), nbytes=1)


def test_refresh_keeps_identity_never_shortens_ttl_and_is_silent() -> None:
    cache, clock = make_cache()
    h = chain(1)
    first, _ = cache.admit(tenant="t1", hashes=h, nbytes=10, ttl_s=100.0)
    cache.lookup(h)
    cache.drain_events()
    clock.t += 10
    again, evicted = cache.admit(tenant="t1", hashes=h, nbytes=10, ttl_s=5.0)
    assert evicted == [] and len(cache) == 1 and cache.bytes_used == 10
    assert again.expires_at == first.expires_at and again.hits == 1
    assert again.created_at == first.created_at and again.last_used == clock.t
    assert cache.drain_events() == []


def test_refresh_with_pin_pins_and_records() -> None:
    cache, _ = make_cache()
    h = chain(1)
    cache.admit(tenant="t1", hashes=h, nbytes=10)
    cache.drain_events()
    entry, _ = cache.admit(tenant="t1", hashes=h, nbytes=10, pin=True)
    assert entry.pinned and cache.pinned_bytes == 10 and cache.warm_prefixes() == [h[-1]]
    assert [e.kind for e in cache.drain_events()] == ["stored"]
    # A later unpinned admission (request path) does not take the pin away.
    entry, _ = cache.admit(tenant="t1", hashes=h, nbytes=10)
    assert entry.pinned and cache.pinned_bytes == 10


def test_admit_evicts_lru_for_bytes() -> None:
    cache, clock = make_cache(max_bytes=300)
    a, b, c = chain(1), chain(2), chain(3)
    for h in (a, b, c):
        cache.admit(tenant="t1", hashes=h, nbytes=100)
        clock.t += 1
    cache.lookup(a)
    cache.drain_events()
    _, evicted = cache.admit(tenant="t1", hashes=chain(4), nbytes=150, command_id="c9")
    assert [e.prefix_hash for e in evicted] == [b[-1], c[-1]]
    assert cache.bytes_used == 250 and a[-1] in cache
    events = cache.drain_events()
    assert [(e.kind, e.reason) for e in events[:2]] == [("evicted", "capacity")] * 2
    assert events[0].command_id == "c9" and events[-1].kind == "stored"


def test_eviction_frees_a_victims_tail_only_as_far_as_needed() -> None:
    cache, clock = make_cache(max_bytes=400)
    old = chain(1, 2, 3, 4)
    cache.admit(tenant="t1", hashes=old, nbytes=400, ttl_s=60.0)
    clock.t += 1
    cache.drain_events()
    _, evicted = cache.admit(tenant="t1", hashes=chain(9), nbytes=150, command_id="c1")
    assert [e.prefix_hash for e in evicted] == [old[-1]]
    head = cache.get(old[1])  # two blocks of 100 leave, the last first; two stay
    assert head is not None and head.kind == "request" and not head.pinned
    assert head.block_hashes == tuple(old[:2]) and head.expires_at is None
    assert cache.peek(old)[1] == 2 and cache.bytes_used == 350
    kinds = [(e.kind, e.reason) for e in cache.drain_events()]
    assert kinds == [("stored", "truncated"), ("evicted", "capacity"), ("stored", "")]


def test_a_victim_wholly_needed_leaves_no_head() -> None:
    cache, clock = make_cache(max_bytes=400)
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=200)
    clock.t += 1
    cache.admit(tenant="t1", hashes=chain(3, 4), nbytes=200)
    _, evicted = cache.admit(tenant="t1", hashes=chain(5, 6), nbytes=200)
    assert [e.prefix_hash for e in evicted] == [chain(1, 2)[-1]]
    assert cache.peek(chain(1, 2))[1] == 0 and len(cache) == 2


def test_an_entry_count_eviction_takes_the_whole_victim() -> None:
    cache, _ = make_cache(max_bytes=1000, max_entries=1)
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=200)
    cache.admit(tenant="t1", hashes=chain(3), nbytes=100)
    assert cache.peek(chain(1, 2))[1] == 0 and len(cache) == 1


def test_admit_evicts_for_entry_count() -> None:
    cache, _ = make_cache(max_entries=2)
    cache.admit(tenant="t1", hashes=chain(1), nbytes=0)
    cache.admit(tenant="t1", hashes=chain(2), nbytes=0)
    _, evicted = cache.admit(tenant="t1", hashes=chain(3), nbytes=0)
    assert [e.prefix_hash for e in evicted] == [chain(1)[-1]] and len(cache) == 2


def test_pinned_entries_are_not_evicted_by_policy() -> None:
    cache, _ = make_cache(max_bytes=200, warm_bytes=200)
    cache.admit(tenant="t1", hashes=chain(1), nbytes=100, pin=True)
    cache.admit(tenant="t1", hashes=chain(2), nbytes=100)
    _, evicted = cache.admit(tenant="t1", hashes=chain(3), nbytes=100)
    assert [e.prefix_hash for e in evicted] == [chain(2)[-1]]
    assert chain(1)[-1] in cache


@pytest.mark.parametrize(
    ("budget", "pinned", "nbytes", "pin", "match"),
    [
        (Budget(100, 10, 50), 0, 101, False, "max_bytes"),
        (Budget(100, 0, 50), 0, 1, False, "no entries"),
        (Budget(100, 10, 50), 40, 20, True, "warm_bytes"),
        (Budget(100, 10, 100), 90, 20, False, "cannot free"),
    ],
)
def test_refusals_change_nothing(
    budget: Budget, pinned: int, nbytes: int, pin: bool, match: str
) -> None:
    cache = PrefixCache(budget, clock=Clock())
    if pinned:
        cache.admit(tenant="t1", hashes=chain(1), nbytes=pinned, pin=True)
    cache.drain_events()
    before = (cache.entries(), cache.bytes_used, cache.pinned_bytes)
    with pytest.raises(WarmupRefused, match=match) as info:
        cache.admit(tenant="t1", hashes=chain(2), nbytes=nbytes, pin=pin)
    assert match in info.value.reason
    assert (cache.entries(), cache.bytes_used, cache.pinned_bytes) == before
    assert cache.drain_events() == []


def test_refusal_does_not_evict_part_way() -> None:
    cache, _ = make_cache(max_bytes=300, warm_bytes=200)
    cache.admit(tenant="t1", hashes=chain(1), nbytes=200, pin=True)
    cache.admit(tenant="t1", hashes=chain(2), nbytes=50)
    with pytest.raises(WarmupRefused):
        cache.admit(tenant="t1", hashes=chain(3), nbytes=150)
    assert chain(2)[-1] in cache and cache.bytes_used == 250


def test_refresh_counts_its_own_bytes_once() -> None:
    cache, _ = make_cache(max_bytes=100, warm_bytes=100)
    cache.admit(tenant="t1", hashes=chain(1), nbytes=100, pin=True)
    entry, evicted = cache.admit(tenant="t1", hashes=chain(1), nbytes=100, pin=True)
    assert evicted == [] and cache.bytes_used == 100 and cache.pinned_bytes == 100


# -- lookup --------------------------------------------------------------------------


def test_lookup_returns_longest_common_prefix() -> None:
    cache, _ = make_cache()
    short, _ = cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30)
    long, _ = cache.admit(tenant="t1", hashes=chain(1, 2, 3, 4, 5), nbytes=50)
    assert cache.lookup(chain(1, 2, 3, 4)) == (long, 4)
    assert cache.lookup(chain(1, 2, 3, 4, 5, 6)) == (long, 5)
    # No entry ends at block 2: the most recently stored holder serves it.
    assert cache.lookup(chain(1, 2, 9)) == (long, 2)
    assert cache.lookup(chain(1, 2)) == (long, 2)
    assert cache.lookup(chain(1, 2, 3)) == (short, 3)
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30)  # a refresh re-stores it
    entry, matched = cache.lookup(chain(1, 2, 9))
    assert entry is not None and (entry.prefix_hash, matched) == (short.prefix_hash, 2)
    assert cache.lookup(chain(7, 2, 3)) == (None, 0)
    assert cache.lookup([]) == (None, 0)


def test_lookup_is_tenant_isolated() -> None:
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=10)
    assert cache.lookup(chain(1, 2, tenant="t2")) == (None, 0)


def test_lookup_touches_and_peek_does_not() -> None:
    cache, clock = make_cache()
    entry, _ = cache.admit(tenant="t1", hashes=chain(1), nbytes=10)
    clock.t += 5
    assert cache.peek(chain(1)) == (entry, 1)
    assert entry.hits == 0 and entry.last_used == 1000.0
    cache.lookup(chain(1))
    assert entry.hits == 1 and entry.last_used == 1005.0


def test_lookup_with_touching_off_is_a_dry_run() -> None:
    cache, clock = make_cache(max_bytes=20, policy="slru")
    entry, _ = cache.admit(tenant="t1", hashes=chain(1), nbytes=10)
    other, _ = cache.admit(tenant="t1", hashes=chain(2), nbytes=10)
    clock.t += 5
    cache.touching = False
    assert cache.lookup(chain(1)) == (entry, 1)
    assert entry.hits == 0 and entry.last_used == 1000.0
    _, evicted = cache.admit(tenant="t1", hashes=chain(3), nbytes=10)
    assert evicted == [entry]  # still never hit: the first victim
    cache.touching = True
    cache.lookup(chain(2))
    _, evicted = cache.admit(tenant="t1", hashes=chain(4), nbytes=10)
    assert other.hits == 1 and [e.prefix_hash for e in evicted] == [chain(3)[-1]]


def test_lookup_demotes_expired_entries_and_still_serves_them() -> None:
    cache, clock = make_cache()
    long, _ = cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=10, ttl_s=10.0, pin=True)
    cache.admit(tenant="t1", hashes=chain(1), nbytes=10, ttl_s=100.0)
    cache.drain_events()
    clock.t += 10
    assert cache.peek(chain(1, 2)) == (long, 2) and long.pinned
    # The lease is over: the KV stays, unpinned and evictable, and still serves.
    assert cache.lookup(chain(1, 2)) == (long, 2) and len(cache) == 2
    assert (long.kind, long.pinned, long.expires_at) == ("request", False, None)
    assert cache.pinned_bytes == 0 and cache.bytes_used == 10
    (event,) = cache.drain_events()
    assert (event.kind, event.reason) == ("released", "expired")


# -- removal -------------------------------------------------------------------------


def test_invalidate_by_exact_refs_is_idempotent() -> None:
    cache, _ = make_cache()
    a, _ = cache.admit(tenant="t1", hashes=chain(1), nbytes=1, chunk_refs=[("d#0", "aa")])
    cache.admit(tenant="t1", hashes=chain(2), nbytes=1, chunk_refs=[("d#0", "bb")])
    cache.admit(tenant="t1", hashes=chain(3), nbytes=1, chunk_refs=[("d#1", "aa")])
    cache.drain_events()
    assert cache.invalidate([("d#0", "aa"), ("x#0", "00")], command_id="c2") == [a]
    (event,) = cache.drain_events()
    assert (event.kind, event.command_id, event.prefix_hash) == ("invalidated", "c2", a.prefix_hash)
    assert cache.invalidate([("d#0", "aa")]) == [] and cache.drain_events() == []
    assert cache.lookup(chain(1)) == (None, 0)


def test_invalidate_chunks_ignores_content_hash() -> None:
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1), nbytes=1, chunk_refs=[("d#0", "aa")])
    cache.admit(tenant="t1", hashes=chain(2), nbytes=1, chunk_refs=[("d#0", "bb"), ("e#0", "cc")])
    cache.admit(tenant="t1", hashes=chain(3), nbytes=1, chunk_refs=[("e#1", "aa")])
    removed = cache.invalidate_chunks(["d#0"])
    assert [e.prefix_hash for e in removed] == [chain(1)[-1], chain(2)[-1]]
    assert len(cache) == 1 and cache.invalidate([("e#0", "cc")]) == []


def test_invalidate_prefix_takes_extensions_and_pinned() -> None:
    cache, _ = make_cache()
    cache.admit(tenant="t1", hashes=chain(1), nbytes=1)
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=1, pin=True)
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=1)
    removed = cache.invalidate_prefix(chain(1, 2)[-1])
    assert {e.prefix_hash for e in removed} == {chain(1, 2)[-1], chain(1, 2, 3)[-1]}
    assert cache.pinned_bytes == 0 and list(cache.warm_prefixes()) == []
    assert cache.lookup(chain(1, 2, 3)) == (cache.get(chain(1)[-1]), 1)


def test_extend_ttl() -> None:
    cache, clock = make_cache()
    cache.admit(tenant="t1", hashes=chain(1), nbytes=1, ttl_s=10.0)
    cache.drain_events()
    clock.t += 5
    entry = cache.extend_ttl(chain(1)[-1], 20.0, command_id="c3")
    assert entry is not None and entry.expires_at == 1025.0
    (event,) = cache.drain_events()
    assert (event.kind, event.command_id) == ("ttl_extended", "c3")
    assert cache.extend_ttl(chain(1)[-1], 1.0) is entry and entry.expires_at == 1025.0
    clock.t = 1015.0  # past the original expiry: the stale heap item must not expire it
    assert cache.expire() == [] and chain(1)[-1] in cache
    clock.t = 1025.0
    # Expired, it is a request entry; extending its TTL makes it managed again.
    again = cache.extend_ttl(chain(1)[-1], 5.0)
    assert again is entry and entry.managed and entry.expires_at == 1030.0
    assert cache.extend_ttl("0" * 32, 5.0) is None
    with pytest.raises(ValueError):
        cache.extend_ttl(chain(1)[-1], 0.0)


def test_release_unpins_and_makes_evictable() -> None:
    cache, _ = make_cache(max_entries=1)
    cache.admit(tenant="t1", hashes=chain(1), nbytes=10, pin=True)
    with pytest.raises(WarmupRefused):
        cache.admit(tenant="t1", hashes=chain(2), nbytes=10)
    cache.drain_events()
    entry = cache.release(chain(1)[-1], command_id="c4")
    assert entry is not None and not entry.pinned and cache.pinned_bytes == 0
    assert [(e.kind, e.command_id) for e in cache.drain_events()] == [("released", "c4")]
    assert cache.release("0" * 32) is None
    _, evicted = cache.admit(tenant="t1", hashes=chain(2), nbytes=10)
    assert evicted == [entry]


def test_evict_is_explicit_and_reaches_pinned() -> None:
    cache, _ = make_cache()
    pinned, _ = cache.admit(tenant="t1", hashes=chain(1), nbytes=10, pin=True)
    cache.admit(tenant="t1", hashes=chain(2), nbytes=10)
    cache.drain_events()
    assert cache.evict([chain(1)[-1], "f" * 32]) == [pinned]
    assert [(e.kind, e.reason) for e in cache.drain_events()] == [("evicted", "explicit")]
    assert cache.pinned_bytes == 0 and cache.bytes_used == 10


def test_expire_demotes_pinned_too_and_none_ttl_never_expires() -> None:
    cache, clock = make_cache(max_entries=2, default_ttl_s=None)
    leased, _ = cache.admit(tenant="t1", hashes=chain(1), nbytes=10, pin=True, ttl_s=5.0)
    forever, _ = cache.admit(tenant="t1", hashes=chain(2), nbytes=10, pin=True)
    clock.t += 1e9
    assert cache.expire() == [leased] and cache.expire() == []
    assert not leased.pinned and forever.pinned and cache.pinned_bytes == 10
    # Demoted, it is the only evictable entry: the next admission takes its room.
    _, evicted = cache.admit(tenant="t1", hashes=chain(3), nbytes=10)
    assert evicted == [leased] and cache.entries() == [forever, cache.get(chain(3)[-1])]


def test_clear_returns_everything() -> None:
    cache, _ = make_cache()
    for b in (1, 2, 3):
        cache.admit(tenant="t1", hashes=chain(b), nbytes=10, pin=b == 1)
    cache.drain_events()
    removed = cache.clear(command_id="c5")
    assert [e.prefix_hash for e in removed] == [chain(b)[-1] for b in (1, 2, 3)]
    assert {e.kind for e in cache.drain_events()} == {"cleared"}
    assert (len(cache), cache.bytes_used, cache.pinned_bytes) == (0, 0, 0)
    assert cache.lookup(chain(1)) == (None, 0)


def test_unknown_policy_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="lru") as info:
        PrefixCache(Budget(1, 1, 1), policy="nope")
    assert "gdsf" in str(info.value) and "lfu-aged" in str(info.value)


@pytest.mark.parametrize("policy", ["lru", "slru", "lfu-aged", "gdsf"])
def test_every_policy_works_in_the_cache(policy: str) -> None:
    cache, clock = make_cache(max_entries=2, policy=policy)
    assert cache.policy_name == policy
    cache.admit(tenant="t1", hashes=chain(1), nbytes=10)
    clock.t += 1
    cache.admit(tenant="t1", hashes=chain(2), nbytes=10)
    for _ in range(3):
        cache.lookup(chain(1))
    _, evicted = cache.admit(tenant="t1", hashes=chain(3), nbytes=10)
    assert [e.prefix_hash for e in evicted] == [chain(2)[-1]]


def test_entry_is_a_cache_entry() -> None:
    cache, _ = make_cache()
    entry, _ = cache.admit(tenant="t1", hashes=chain(1), nbytes=10)
    assert isinstance(entry, CacheEntry) and not entry.expired(entry.created_at)


def test_a_request_over_a_warm_entry_marks_a_shared_ref_from_its_earlier_start() -> None:
    # Found by the block-store state machine: two documents hold the same chunk text, the
    # warm prefix saw the ref at block 1, the request over it at block 0; invalidating the
    # ref must cut from block 0.
    cache, _ = make_cache()
    ref = ("d#1", "h0")
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, chunk_refs={ref},
                chunk_starts={ref: BLOCK_SIZE})
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, chunk_refs={ref},
                chunk_starts={ref: 0}, kind="request")
    cache.invalidate([ref])
    assert cache.lookup(chain(1, 2)) == (None, 0)
