"""Stateful property tests: the prefix cache against a brute-force model."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule

from workers.blocks import BLOCK_SIZE, block_hashes
from workers.cache import Budget, CacheEntry, PrefixCache, WarmupRefused

BUDGET = Budget(max_bytes=400, max_entries=5, warm_bytes=150)
TENANTS = ("a", "b")
REFS = (("d#0", "h0"), ("d#0", "h1"), ("d#1", "h0"), ("e#0", "h2"))
# Three distinct blocks, so random sequences share prefixes often.
sequences = st.lists(st.integers(0, 2), min_size=1, max_size=4)


@dataclass
class Model:
    tenant: str
    chain: tuple[str, ...]
    nbytes: int
    refs: frozenset[tuple[str, str]]
    pinned: bool
    expires_at: float | None


def chain_of(tenant: str, blocks: list[int]) -> tuple[str, ...]:
    ids = [b * 1000 + i for b in blocks for i in range(BLOCK_SIZE)]
    return tuple(block_hashes(ids, tenant=tenant, model="m"))


def common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class CacheMachine(RuleBasedStateMachine):
    stored = Bundle("stored")

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.cache = PrefixCache(BUDGET, clock=lambda: self.now, default_ttl_s=50.0)
        self.model: dict[str, Model] = {}
        self.gone: set[str] = set()  # invalidated or expired, until stored again

    def live(self) -> dict[str, Model]:
        return {
            k: m for k, m in self.model.items() if m.expires_at is None or m.expires_at > self.now
        }

    def forget(self, removed: list[CacheEntry], kind: str, then: str | None = None) -> None:
        events = [(e.kind, e.prefix_hash) for e in self.cache.drain_events()]
        expected = [(kind, e.prefix_hash) for e in removed]
        assert events in (expected, expected + [("stored", then)])
        for entry in removed:
            del self.model[entry.prefix_hash]
            self.gone.add(entry.prefix_hash)

    def sync_expired(self) -> None:
        expired = {k for k in self.model if k not in self.live()}
        removed = self.cache.expire()
        assert {e.prefix_hash for e in removed} == expired
        self.forget(removed, "evicted")

    @rule(dt=st.sampled_from([0.0, 5.0, 30.0, 60.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(
        target=stored,
        tenant=st.sampled_from(TENANTS),
        blocks=sequences,
        nbytes=st.integers(0, 450),
        refs=st.sets(st.sampled_from(REFS), max_size=2),
        pin=st.booleans(),
        ttl=st.sampled_from([None, 10.0, 100.0]),
    )
    def admit(
        self,
        tenant: str,
        blocks: list[int],
        nbytes: int,
        refs: set[tuple[str, str]],
        pin: bool,
        ttl: float | None,
    ) -> object:
        self.sync_expired()
        chain = chain_of(tenant, blocks)
        before = (self.cache.entries(), self.cache.bytes_used, self.cache.pinned_bytes)
        try:
            entry, evicted = self.cache.admit(
                tenant=tenant, hashes=chain, nbytes=nbytes, chunk_refs=refs, ttl_s=ttl, pin=pin
            )
        except WarmupRefused:
            event("admit refused")
            assert (self.cache.entries(), self.cache.bytes_used, self.cache.pinned_bytes) == before
            assert self.cache.drain_events() == []
            assert self.refusal_justified(chain[-1], nbytes, pin)
            return multiple()
        assert all(not e.pinned and e.prefix_hash != chain[-1] for e in evicted)
        event("admit evicted" if evicted else "admit fitted")
        self.forget(evicted, "evicted", then=chain[-1])
        old = self.model.get(chain[-1])
        expires: float | None = self.now + (ttl or 50.0)
        if old is not None:
            expires = (
                None if old.expires_at is None else max(old.expires_at, self.now + (ttl or 50.0))
            )
        pinned = pin or (old is not None and old.pinned)
        self.model[chain[-1]] = Model(tenant, chain, nbytes, frozenset(refs), pinned, expires)
        self.gone.discard(chain[-1])
        assert (entry.pinned, entry.expires_at, entry.nbytes) == (pinned, expires, nbytes)
        return (tenant, blocks)

    def refusal_justified(self, key: str, nbytes: int, pin: bool) -> bool:
        others = {k: m for k, m in self.model.items() if k != key}
        pinned = pin or (key in self.model and self.model[key].pinned)
        warm = sum(m.nbytes for m in others.values() if m.pinned) + nbytes
        evictable_free = BUDGET.max_bytes - sum(m.nbytes for m in others.values() if m.pinned)
        pinned_count = sum(m.pinned for m in others.values())
        return (
            nbytes > BUDGET.max_bytes
            or (pinned and warm > BUDGET.warm_bytes)
            or nbytes > evictable_free
            or pinned_count + 1 > BUDGET.max_entries
        )

    @rule(tenant=st.sampled_from(TENANTS), blocks=st.lists(st.integers(0, 2), max_size=5))
    def lookup(self, tenant: str, blocks: list[int]) -> None:
        self.check_lookup(tenant, blocks)

    @rule(
        item=stored,
        cut=st.integers(1, 4),
        tail=st.lists(st.integers(0, 2), max_size=2),
        other_tenant=st.sampled_from([False, False, False, True]),
    )
    def lookup_near_stored(
        self, item: tuple[str, list[int]], cut: int, tail: list[int], other_tenant: bool
    ) -> None:
        """Queries sharing a prefix with something stored once, maybe by the other tenant."""
        tenant, blocks = item
        if other_tenant:
            tenant = TENANTS[1 - TENANTS.index(tenant)]
        self.check_lookup(tenant, blocks[:cut] + tail)

    def check_lookup(self, tenant: str, blocks: list[int]) -> None:
        query = chain_of(tenant, blocks)
        expired = {k for k in self.model if k not in self.live()}
        entry, matched = self.cache.lookup(query)
        events = self.cache.drain_events()
        assert {(e.kind, e.reason) for e in events} <= {("evicted", "expired")}
        assert {e.prefix_hash for e in events} == expired
        for key in expired:
            del self.model[key]
            self.gone.add(key)
        best = max((common(query, m.chain) for m in self.live().values()), default=0)
        assert matched == best
        event(f"lookup matched {min(matched, 3)}+ blocks")
        if expired:
            event("lookup expired entries")
        if entry is None:
            assert matched == 0
        else:
            assert matched > 0 and entry.tenant == tenant
            assert entry.block_hashes[:matched] == query[:matched]
            assert entry.prefix_hash in self.live() and entry.prefix_hash not in self.gone

    @rule(refs=st.sets(st.sampled_from(REFS), max_size=2))
    def invalidate(self, refs: set[tuple[str, str]]) -> None:
        expected = {k for k, m in self.model.items() if m.refs & refs}
        removed = self.cache.invalidate(refs)
        assert {e.prefix_hash for e in removed} == expected
        self.forget(removed, "invalidated")

    @rule(chunk_id=st.sampled_from(["d#0", "d#1", "e#0", "x#9"]))
    def invalidate_chunks(self, chunk_id: str) -> None:
        expected = {k for k, m in self.model.items() if any(r[0] == chunk_id for r in m.refs)}
        removed = self.cache.invalidate_chunks([chunk_id])
        assert {e.prefix_hash for e in removed} == expected
        self.forget(removed, "invalidated")

    @rule(tenant=st.sampled_from(TENANTS), blocks=sequences)
    def invalidate_prefix(self, tenant: str, blocks: list[int]) -> None:
        key = chain_of(tenant, blocks)[-1]
        expected = {k for k, m in self.model.items() if key in m.chain}
        removed = self.cache.invalidate_prefix(key)
        assert {e.prefix_hash for e in removed} == expected
        self.forget(removed, "invalidated")

    @rule(tenant=st.sampled_from(TENANTS), blocks=sequences)
    def release(self, tenant: str, blocks: list[int]) -> None:
        key = chain_of(tenant, blocks)[-1]
        entry = self.cache.release(key)
        assert (entry is None) == (key not in self.model)
        if key in self.model:
            self.model[key].pinned = False
        self.cache.drain_events()

    @rule(tenant=st.sampled_from(TENANTS), blocks=sequences)
    def extend_ttl(self, tenant: str, blocks: list[int]) -> None:
        self.sync_expired()
        key = chain_of(tenant, blocks)[-1]
        entry = self.cache.extend_ttl(key, 40.0)
        assert (entry is None) == (key not in self.model)
        if entry is not None:
            old = self.model[key].expires_at
            self.model[key].expires_at = None if old is None else max(old, self.now + 40.0)
            assert entry.expires_at == self.model[key].expires_at
        self.cache.drain_events()

    @rule(tenant=st.sampled_from(TENANTS), blocks=sequences)
    def evict(self, tenant: str, blocks: list[int]) -> None:
        key = chain_of(tenant, blocks)[-1]
        removed = self.cache.evict([key])
        assert [e.prefix_hash for e in removed] == ([key] if key in self.model else [])
        self.forget(removed, "evicted")

    @invariant()
    def within_budget(self) -> None:
        entries = self.cache.entries()
        assert self.cache.bytes_used == sum(e.nbytes for e in entries) <= BUDGET.max_bytes
        assert self.cache.pinned_bytes == sum(e.nbytes for e in entries if e.pinned)
        assert self.cache.pinned_bytes <= BUDGET.warm_bytes
        assert len(self.cache) == len(entries) <= BUDGET.max_entries
        assert sorted(self.cache.warm_prefixes()) == sorted(
            k for k, m in self.model.items() if m.pinned
        )

    @invariant()
    def matches_model(self) -> None:
        assert {e.prefix_hash for e in self.cache.entries()} == set(self.model)


CacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCacheMachine = CacheMachine.TestCase
