"""Property tests of the block store: budgets, reference counts, invalidation, sharing."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from workers.kv.blocks import BLOCK_SIZE, block_hashes
from workers.kv.cache import Budget, PrefixCache, WarmupRefused

BUDGET = Budget(max_bytes=400, max_entries=6, warm_bytes=150)
TENANTS = ("a", "b")
REFS = (("d#0", "h0"), ("d#0", "h1"), ("d#1", "h0"), ("e#0", "h2"))
# Three distinct blocks, so random sequences share prefixes often.
sequences = st.lists(st.integers(0, 2), min_size=1, max_size=4)
BLOCK_BYTES = 20


def chain_of(tenant: str, blocks: list[int]) -> tuple[str, ...]:
    ids = [b * 1000 + i for b in blocks for i in range(BLOCK_SIZE)]
    return tuple(block_hashes(ids, tenant=tenant, model="m"))


def common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class BlockStoreMachine(RuleBasedStateMachine):
    """Random admissions, lookups, invalidations, expiry and eviction against invariants
    recomputed by brute force from the entries."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.cache = PrefixCache(BUDGET, clock=lambda: self.now, default_ttl_s=50.0)
        # Chunk refs each cached block's chain was said to pass through, while it lives.
        self.through: dict[str, set[tuple[str, str]]] = {}

    @rule(dt=st.sampled_from([0.0, 5.0, 30.0, 60.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.cache.expire()

    @rule(
        tenant=st.sampled_from(TENANTS),
        blocks=sequences,
        refs=st.dictionaries(st.sampled_from(REFS), st.integers(0, 4 * BLOCK_SIZE), max_size=2),
        pin=st.booleans(),
        request=st.booleans(),
        ttl=st.sampled_from([None, 10.0, 100.0]),
    )
    def admit(
        self,
        tenant: str,
        blocks: list[int],
        refs: dict[tuple[str, str], int],
        pin: bool,
        request: bool,
        ttl: float | None,
    ) -> None:
        chain = chain_of(tenant, blocks)
        starts = {r: s for r, s in refs.items() if s < len(chain) * BLOCK_SIZE}
        before = (self.cache.bytes_used, self.cache.pinned_bytes, len(self.cache))
        try:
            _, evicted = self.cache.admit(
                tenant=tenant,
                hashes=chain,
                nbytes=BLOCK_BYTES * len(chain),
                chunk_refs=starts,
                chunk_starts=starts,
                ttl_s=ttl,
                pin=pin and not request,
                kind="request" if request else "managed",
            )
        except WarmupRefused:
            event("admit refused")
            assert (self.cache.bytes_used, self.cache.pinned_bytes, len(self.cache)) == before
            return
        assert all(not e.pinned for e in evicted)
        event("admit evicted" if evicted else "admit fitted")
        self.forget_freed()
        for ref, start in starts.items():
            for h in chain[start // BLOCK_SIZE :]:
                self.through.setdefault(h, set()).add(ref)

    @rule(tenant=st.sampled_from(TENANTS), blocks=st.lists(st.integers(0, 2), max_size=5))
    def lookup(self, tenant: str, blocks: list[int]) -> None:
        query = chain_of(tenant, blocks)
        entry, matched = self.cache.lookup(query)
        best = max((common(query, e.block_hashes) for e in self.cache.entries()), default=0)
        assert matched == best
        event(f"lookup matched {min(matched, 3)}+ blocks")
        if entry is not None:
            assert entry.block_hashes[:matched] == query[:matched] and entry.tenant == tenant

    @rule(refs=st.sets(st.sampled_from(REFS), min_size=1, max_size=2))
    def invalidate(self, refs: set[tuple[str, str]]) -> None:
        removed = self.cache.invalidate(refs)
        event(f"invalidate removed {min(len(removed), 2)}+ entries")
        self.forget_freed()
        stale = [h for h in self.pool_hashes() if self.through.get(h, set()) & refs
                 and not self.forks(h, refs.__contains__)]
        assert stale == []
        assert not any(e.chunk_refs & refs for e in self.cache.entries())  # all of them left

    @rule(chunk_id=st.sampled_from(["d#0", "d#1", "e#0", "x#9"]))
    def invalidate_chunks(self, chunk_id: str) -> None:
        self.cache.invalidate_chunks([chunk_id])
        self.forget_freed()
        def changed(ref: tuple[str, str]) -> bool:
            return ref[0] == chunk_id

        assert not any(
            changed(ref) and not self.forks(h, changed)
            for h in self.pool_hashes() for ref in self.through.get(h, ())
        )
        assert not any(changed(r) for e in self.cache.entries() for r in e.chunk_refs)

    @rule(tenant=st.sampled_from(TENANTS), blocks=sequences)
    def release_or_evict(self, tenant: str, blocks: list[int]) -> None:
        key = chain_of(tenant, blocks)[-1]
        self.cache.release(key)
        if blocks[0] == 0:
            self.cache.evict([key])
        self.forget_freed()

    def forks(self, h: str, changed: Callable[[tuple[str, str]], bool]) -> bool:
        """A block a change marks may stay only where a live chain goes on from it into a
        block whose chunks are known and unchanged: its tokens (hence its KV) are that
        chain's too."""
        for entry in self.cache.entries():
            chain = list(entry.block_hashes)
            if h in chain and chain.index(h) + 1 < len(chain):
                after = self.through.get(chain[chain.index(h) + 1], set())
                if after and not any(map(changed, after)):
                    return True
        return False

    def pool_hashes(self) -> set[str]:
        return {b.block_hash for b in self.cache.pool.blocks()}

    def forget_freed(self) -> None:
        live = self.pool_hashes()
        self.through = {h: r for h, r in self.through.items() if h in live}

    @invariant()
    def bytes_within_budget_and_counted_once(self) -> None:
        entries = self.cache.entries()
        union = {h for e in entries for h in e.block_hashes}
        pinned = {h for e in entries if e.pinned for h in e.block_hashes}
        assert self.cache.bytes_used == BLOCK_BYTES * len(union) <= BUDGET.max_bytes
        assert self.cache.pinned_bytes == BLOCK_BYTES * len(pinned) <= BUDGET.warm_bytes
        assert len(entries) <= BUDGET.max_entries

    @invariant()
    def held_blocks_are_never_freed(self) -> None:
        entries = self.cache.entries()
        holders: dict[str, set[str]] = {}
        for e in entries:
            for h in e.block_hashes:
                holders.setdefault(h, set()).add(e.prefix_hash)
        assert self.pool_hashes() == set(holders)
        for block in self.cache.pool.blocks():
            assert set(block.holders) == holders[block.block_hash]
        stats = self.cache.block_stats()
        assert stats.shared_blocks == sum(len(k) > 1 for k in holders.values())
        managed = {h for e in entries if e.managed for h in e.block_hashes}
        assert (stats.managed_blocks, stats.request_blocks) == (
            len(managed),
            len(holders) - len(managed),
        )


BlockStoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockStoreMachine = BlockStoreMachine.TestCase


@settings(max_examples=60, deadline=None)
@given(
    shared=st.lists(st.integers(0, 9), min_size=0, max_size=4),
    left=st.lists(st.integers(10, 19), min_size=1, max_size=3),
    right=st.lists(st.integers(20, 29), min_size=1, max_size=3),
    block_bytes=st.integers(1, 50),
)
def test_two_prefixes_sharing_k_blocks_use_the_bytes_of_their_union(
    shared: list[int], left: list[int], right: list[int], block_bytes: int
) -> None:
    cache = PrefixCache(Budget(10**6, 10, 10**6))
    a, b = chain_of("t", shared + left), chain_of("t", shared + right)
    cache.admit(tenant="t", hashes=a, nbytes=block_bytes * len(a), pin=True)
    cache.admit(tenant="t", hashes=b, nbytes=block_bytes * len(b), kind="request")
    k = len(shared)
    assert cache.bytes_used == block_bytes * (len(a) + len(b) - k)
    assert cache.block_stats().shared_blocks == k
    assert cache.pinned_bytes == block_bytes * len(a)


def test_a_block_shared_with_an_eviction_victim_keeps_its_chunk_mark() -> None:
    # Found by the state machine: admitting [x1, x2] evicted the only other holder of x1,
    # which freed x1 (and its chunk mark) before the new entry held it again, so a later
    # invalidation of the chunk left x1 cached.
    cache = PrefixCache(Budget(2 * BLOCK_BYTES, 8, 2 * BLOCK_BYTES), default_ttl_s=None)
    x, z = chain_of("t", [1, 0]), chain_of("t", [2])
    ref = ("d#0", "h0")
    cache.admit(tenant="t", hashes=x[:1], nbytes=BLOCK_BYTES, chunk_refs=[ref],
                chunk_starts={ref: 0})
    cache.admit(tenant="t", hashes=z, nbytes=BLOCK_BYTES)
    cache.lookup(z)  # z is now the most recently used: x[:1] is the victim
    _, evicted = cache.admit(tenant="t", hashes=x, nbytes=2 * BLOCK_BYTES)
    assert x[0] in [e.prefix_hash for e in evicted]
    cache.invalidate([ref])
    assert x[0] not in {b.block_hash for b in cache.pool.blocks()}
