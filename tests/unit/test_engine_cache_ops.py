"""The cache's mutations through the engine (`invalidate`, `extend_ttl`, `release`,
`expire`): each changes the bookkeeping and frees the KV of what left, so the caller never
reaches into `engine.cache` and then calls `sync()` (the model-free engine, which keeps the
bookkeeping every engine shares)."""

from __future__ import annotations

from workers.cost_engine import CostEngine, CostModel
from workers.kv.cache import PrefixCache
from workers.kv.memory import Budget

REF = ("doc-1", "v1")


def _engine(now: list[float]) -> CostEngine:
    cache = PrefixCache(Budget(1 << 20, 100, 1 << 20), policy="lru", clock=lambda: now[0],
                        default_ttl_s=60.0, block_size=16)
    return CostEngine(CostModel(1.0, 1.0), cache, model_id="m", kv_bytes_per_token=10)


def test_invalidate_removes_the_tenants_entries_through_the_chunk_and_their_extensions() -> None:
    engine = _engine([0.0])
    head = engine.prefill(list(range(32)), tenant="t", chunk_refs=[REF])
    longer = engine.prefill(list(range(48)), tenant="t", kind="request")  # extends, no refs
    other = engine.prefill(list(range(32)), tenant="u", chunk_refs=[REF])
    removed = engine.invalidate([REF], tenant="t", command_id="c1")
    assert {e.prefix_hash for e in removed} >= {head.prefix_hash, longer.prefix_hash}
    assert head.prefix_hash not in engine.cache and longer.prefix_hash not in engine.cache
    assert other.prefix_hash in engine.cache  # another tenant's identical chunk stays
    assert engine.sync() == 0  # the engine freed their KV itself
    assert engine.memory().used == 32 * 10


def test_invalidate_by_prefix_hash_alone_and_of_nothing() -> None:
    engine = _engine([0.0])
    entry = engine.prefill(list(range(32)), tenant="t")
    assert engine.invalidate([], tenant="t", prefix_hash="0" * 32) == []
    assert engine.invalidate([], tenant="t", prefix_hash=entry.prefix_hash)
    # The prefix's last block goes; the block before it stays cached as its own entry.
    assert entry.prefix_hash not in engine.cache and engine.memory().used == 16 * 10
    assert engine.sync() == 0


def test_extend_ttl_defaults_to_the_caches_ttl_and_says_when_nothing_is_held() -> None:
    now = [0.0]
    engine = _engine(now)
    entry = engine.prefill(list(range(32)), tenant="t", ttl_s=10.0)
    assert entry.prefix_hash is not None
    extended = engine.extend_ttl(entry.prefix_hash, None)
    assert extended is not None and extended.expires_at == 60.0
    assert engine.extend_ttl("0" * 32, 5.0) is None


def test_expire_demotes_what_is_past_its_ttl_and_release_unpins() -> None:
    now = [0.0]
    engine = _engine(now)
    short = engine.prefill(list(range(32)), tenant="t", ttl_s=10.0)
    pinned = engine.prefill(list(range(100, 132)), tenant="t", pin=True)
    now[0] = 11.0
    assert [e.prefix_hash for e in engine.expire()] == [short.prefix_hash]
    assert engine.expire() == []
    assert pinned.prefix_hash is not None
    released = engine.release(pinned.prefix_hash)
    assert released is not None and not released.pinned
    assert engine.release("0" * 32) is None
