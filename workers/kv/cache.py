"""Pure KV-cache bookkeeping: prefix entries over a shared block pool, TTLs, budgets, events.

An entry is a chain of blocks (`workers.kv.block_pool`). Two kinds share one byte budget:
managed entries (warmup: pinned or with a TTL, invalidated by chunk refs) and request
entries (a request's own prompt, evicted by the policy). Blocks shared by entries count once.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from workers.kv.block_pool import BlockPool, ChunkKey, Holding, PoolStats, split_bytes
from workers.kv.blocks import BLOCK_SIZE
from workers.kv.entries import (
    Asked,
    CacheEntry,
    CacheEvent,
    ChunkIndex,
    EventKind,
    Kind,
    Retired,
    Stale,
    WarmupRefused,
    build_entry,
    check_admission,
    doomed_blocks,
    first_cuts,
    head_entry,
    holding,
    observable,
)
from workers.kv.eviction import EvictionPolicy, make_policy
from workers.kv.memory import Budget, capped, quota_check, tenant_quota
from workers.kv.plan import KVPlan
from workers.kv.tier_journal import TierJournal, TierOps

__all__ = ["Budget", "CacheEntry", "CacheEvent", "ChunkKey", "PrefixCache", "WarmupRefused"]


# A holder key no prefix hash can take (hashes are hex) and a holding that counts nothing.
_ADMITTING = "<admitting>"
_BARE = Holding(pinned=False, managed=False)

class PrefixCache:
    """Prefix entries over a block pool, with dependencies, TTLs, pins, budgets and events.

    Hashes passed in must be chains from `block_hashes`: a block hash then identifies its
    whole leading chain, which is what makes lookup a binary search over dict probes.
    Every block in the pool is held by at least one entry, and by every entry whose chain
    contains it; blocks leave the pool with their last holder (`take_plan` names them).
    """

    def __init__(
        self,
        budget: Budget,
        *,
        policy: str = "lru",
        clock: Callable[[], float] = time.monotonic,
        default_ttl_s: float | None = 3600.0,
        block_size: int = BLOCK_SIZE,
        tenant_share: float = 1.0,
        max_ttl_s: float | None = None,
    ) -> None:
        tenant_quota(1, tenant_share)  # a share outside (0, 1] fails here, not at admission
        self.tenant_share, self.max_ttl_s = tenant_share, max_ttl_s
        if default_ttl_s is not None and default_ttl_s <= 0:
            raise ValueError(f"default_ttl_s must be > 0 or None, got {default_ttl_s}")
        self._budget = budget
        self.block_size = block_size
        self.default_ttl_s = capped(default_ttl_s, max_ttl_s)
        self._policy: EvictionPolicy = make_policy(policy)
        self._clock = clock
        self._entries: dict[str, CacheEntry] = {}
        self._stamp: dict[str, int] = {}
        self._stamps = itertools.count()
        self._index = ChunkIndex()
        self.pool = BlockPool()
        self._expiry: list[tuple[float, str]] = []
        self._events: list[CacheEvent] = []
        self._gone: list[str] = []  # prefixes removed since the last plan
        self.tier: TierJournal | None = None  # set by an engine keeping a disk tier
        self.touching = True  # False: lookups are dry runs that touch nothing (timing trials)
        self.retired = Retired()  # chunk versions invalidated lately: no request caches them

    # -- read side -------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        return self._budget

    @property
    def policy_name(self) -> str:
        return self._policy.name

    @property
    def bytes_used(self) -> int:
        """Bytes of the blocks in the pool, each counted once."""
        return self.pool.bytes_used

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the blocks held by at least one pinned entry."""
        return self.pool.pinned_bytes

    def block_stats(self) -> PoolStats:
        return self.pool.stats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, prefix_hash: object) -> bool:
        return prefix_hash in self._entries

    def get(self, prefix_hash: str, *, now: float | None = None) -> CacheEntry | None:
        """The entry stored under `prefix_hash`, without touching it."""
        return self._entries.get(prefix_hash)

    def entries(self) -> list[CacheEntry]:
        return list(self._entries.values())

    def warm_prefixes(self) -> list[str]:
        """Prefix hashes of the pinned (warmup-owned) entries."""
        return [k for k, e in self._entries.items() if e.pinned]

    def lookup(
        self, hashes: Sequence[str], *, now: float | None = None
    ) -> tuple[CacheEntry | None, int]:
        """The longest leading run of `hashes` in the pool, whoever stored it.

        Returns an entry holding its last block (the one ending there, else the latest
        stored) and the run's length in blocks. TTLs due are applied first; the entry is
        touched (`last_used`, `hits` and the eviction policy) unless `touching` is off.
        """
        t = self._now(now)
        self.expire(t)
        entry, matched = self._match(hashes)
        if entry is not None and self.touching:
            entry.last_used = t
            entry.hits += 1
            self._policy.touch(entry.prefix_hash)
        return entry, matched

    def peek(
        self, hashes: Sequence[str], *, now: float | None = None
    ) -> tuple[CacheEntry | None, int]:
        """Like `lookup`, without side effects."""
        return self._match(hashes)

    def drain_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

    def take_plan(self) -> KVPlan:
        """What the engine must do to its KV since the last plan (`workers.kv.plan`)."""
        free = tuple(dict.fromkeys(h for h in self.pool.drain_freed() if h not in self.pool))
        gone = tuple(dict.fromkeys(k for k in self._gone if k not in self._entries))
        self._gone = []
        return KVPlan(self.tier.drain() if self.tier is not None else TierOps(), free, gone)

    # -- write side ------------------------------------------------------------------

    def admit(
        self,
        *,
        tenant: str,
        hashes: Sequence[str],
        nbytes: int,
        chunk_refs: Iterable[ChunkKey] = (),
        ttl_s: float | None = None,
        pin: bool = False,
        command_id: str | None = None,
        kind: Kind = "managed",
        chunk_starts: Mapping[ChunkKey, int] | None = None,
        approx_from: int | None = None,
        transient: bool = False,
    ) -> tuple[CacheEntry, list[CacheEntry]]:
        """Store a prefix (or refresh the identical one), evicting by policy to fit.

        `nbytes` is the KV size of the whole chain; blocks already in the pool keep theirs.
        `kind="request"` stores a request's own prompt: unpinned, no TTL, evictable. Blocks
        from index `approx_from` on hold a blend's KV (`Block.approx`).
        `transient`: evict nothing for it (it may pass the budget), as it leaves at once for
        the tier (`spill`). Returns (entry, evicted). Nothing changes when it raises
        `WarmupRefused`.
        A refresh never shortens the expiry, unpins nor demotes; it records a `stored`
        event only when the pin, kind, size or chunk refs changed.
        """
        chain = tuple(hashes)
        check_admission(chain, nbytes, ttl_s)
        ttl_s = capped(ttl_s, self.max_ttl_s)
        t = self._clock()
        self.expire(t)
        old = self._entries.get(chain[-1])
        if old is not None and old.tenant != tenant:
            raise ValueError(f"prefix {chain[-1]} belongs to tenant {old.tenant!r}, not {tenant!r}")
        sizes = self._block_sizes(chain, nbytes)
        refs = frozenset(chunk_refs)
        self.retired.admitting(tenant, refs, kind == "request", t)
        starts = {r: s for r, s in (chunk_starts or {}).items() if r in refs}
        entry = build_entry(chain, tenant, (sum(sizes), self.block_size), refs, starts,
                            Asked(pin, kind, ttl_s), self.default_ttl_s, t, old)
        self._check_fit(chain, sizes, entry.pinned)
        quota_check(self.pool, self._budget, self.tenant_share, tenant, chain, sizes,
                    entry.pinned, entry.managed)
        victims, kept = ([], 0) if transient else self._plan_eviction(chain, sizes, old)
        # The incoming chain is held while victims leave: a block it shares with a victim
        # must not be freed (its KV and chunk marks would be lost) only to be re-added.
        self.pool.hold(_ADMITTING, tenant, chain, sizes, _BARE, approx_from)
        try:
            self._evict(victims, kept, command_id)
            self._place(entry, sizes, old)
        finally:
            self.pool.release(_ADMITTING, chain, _BARE)
        if old is None or observable(old) != observable(entry):
            self._record("stored", entry, command_id, "", t)
        return entry, victims

    def invalidate(
        self, chunk_refs: Iterable[ChunkKey], *, command_id: str | None = None,
        tenant: str | None = None,
    ) -> list[CacheEntry]:
        """Free every block whose chain passes through any of `chunk_refs` (idempotent), of
        `tenant`'s chains only when given. Entries holding such a block are removed (event
        `invalidated`); what they held before it stays cached (see `_cut`). Returns them.
        """
        return self._invalidate(Stale(refs=frozenset(chunk_refs), tenant=tenant), command_id)

    def invalidate_chunks(
        self, chunk_ids: Iterable[str], *, command_id: str | None = None
    ) -> list[CacheEntry]:
        """Like `invalidate`, by chunk id whatever the content hash."""
        return self._invalidate(Stale(chunk_ids=frozenset(chunk_ids)), command_id)

    def invalidate_prefix(
        self, prefix_hash: str, *, command_id: str | None = None
    ) -> list[CacheEntry]:
        """Free block `prefix_hash` and everything after it in any chain."""
        return self._cut({prefix_hash}, command_id, "prefix")

    def extend_ttl(
        self,
        prefix_hash: str,
        ttl_s: float,
        *,
        now: float | None = None,
        command_id: str | None = None,
    ) -> CacheEntry | None:
        """Push the expiry to at least now + ttl_s; None when the entry is gone.

        A request entry (an expired warm prefix among them) becomes managed again.
        """
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        ttl_s, t = capped(ttl_s, self.max_ttl_s) or ttl_s, self._now(now)
        self.expire(t)
        entry = self._entries.get(prefix_hash)
        if entry is None:
            return None
        if not entry.managed:
            sizes = [self.pool[h].nbytes for h in entry.block_hashes]
            quota_check(self.pool, self._budget, self.tenant_share, entry.tenant,
                        entry.block_hashes, sizes, entry.pinned, True)
            self._rehold(entry, entry.pinned, "managed", t + ttl_s)
        elif entry.expires_at is not None and entry.expires_at < t + ttl_s:
            entry.expires_at = t + ttl_s
            heapq.heappush(self._expiry, (entry.expires_at, prefix_hash))
        self._record("ttl_extended", entry, command_id, "", t)
        return entry

    def release(self, prefix_hash: str, *, command_id: str | None = None) -> CacheEntry | None:
        """Unpin an entry so the policy may evict it; None when it is not here."""
        entry = self._entries.get(prefix_hash)
        if entry is None:
            return None
        if entry.pinned:
            self._rehold(entry, False, entry.kind, entry.expires_at)
        self._record("released", entry, command_id, "", self._clock())
        return entry

    def spill(self, prefix_hash: str, *, command_id: str | None = None) -> CacheEntry | None:
        """Send an entry down to the KV tier as an eviction for room would (event `evicted`,
        reason `tier`); None when it is not here."""
        if self.tier is None or prefix_hash not in self._entries:
            return None
        return self._remove(prefix_hash, "evicted", command_id, "tier", by_policy=True)

    def evict(
        self, prefix_hashes: Iterable[str], *, command_id: str | None = None
    ) -> list[CacheEntry]:
        """Remove the named entries, pinned or not (an explicit order, not policy)."""
        keys = {k for k in prefix_hashes if k in self._entries}
        return self._remove_all(keys, "evicted", command_id, "explicit")

    def expire(self, now: float | None = None) -> list[CacheEntry]:
        """Managed entries past their TTL become request entries: unpinned and evictable.

        Their KV stays and keeps serving until the policy needs the room (event
        `released`, reason `expired`). Returns the entries demoted.
        """
        t = self._now(now)
        demoted: list[CacheEntry] = []
        while self._expiry and self._expiry[0][0] <= t:
            at, key = heapq.heappop(self._expiry)
            entry = self._entries.get(key)
            # Stale heap items (extended or removed entries) are skipped lazily.
            if entry is not None and entry.managed and entry.expires_at == at:
                self._rehold(entry, False, "request", None)
                self._record("released", entry, None, "expired", t)
                demoted.append(entry)
        return demoted

    def clear(self, *, command_id: str | None = None) -> list[CacheEntry]:
        """Remove everything, one `cleared` event per entry."""
        return self._remove_all(set(self._entries), "cleared", command_id, "cleared")

    # -- lookup ----------------------------------------------------------------------

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _match(self, hashes: Sequence[str]) -> tuple[CacheEntry | None, int]:
        # Chains make "hashes[k-1] is in the pool" monotone in k: binary search.
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in self.pool:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return None, 0
        return self._best_holder(hashes[lo - 1]), lo

    def _best_holder(self, block_hash: str) -> CacheEntry:
        # The entry ending exactly there, else the most recently stored holder: O(1) even
        # when thousands of entries share a system prompt, and deterministic.
        exact = self._entries.get(block_hash)
        if exact is not None:
            return exact
        return self._entries[next(reversed(self.pool[block_hash].holders))]

    # -- admission -------------------------------------------------------------------

    def _block_sizes(self, chain: tuple[str, ...], nbytes: int) -> list[int]:
        spread = split_bytes(nbytes, len(chain))
        held = (self.pool.get(h) for h in chain)
        return [b.nbytes if b is not None else n for b, n in zip(held, spread, strict=True)]

    def _check_fit(self, chain: tuple[str, ...], sizes: list[int], pinned: bool) -> None:
        budget = self._budget
        if budget.max_entries < 1:
            raise WarmupRefused("the cache budget allows no entries (max_entries=0)")
        total = sum(sizes)
        if total > budget.max_bytes:
            raise WarmupRefused(f"entry of {total} bytes exceeds max_bytes={budget.max_bytes}")
        if pinned:
            after = self.pool.pinned_bytes + self.pool.unpinned_bytes(chain, sizes)
            if after > budget.warm_bytes:
                raise WarmupRefused(
                    f"pinned bytes would reach {after}, over warm_bytes={budget.warm_bytes}"
                )

    def _plan_eviction(
        self, chain: tuple[str, ...], sizes: list[int], old: CacheEntry | None
    ) -> tuple[list[CacheEntry], int]:
        """The entries to evict, in order, and how many leading blocks of the last one to
        keep (0: all of it goes).

        Only as much of the last victim goes as the admission needs, its last blocks first
        (vLLM's free queue frees a prompt tail first): its head stays as a request entry.
        On a budget of a few prompts, evicting whole entries dropped the shared head of a
        prompt asked again and again with its tail (docs/lab/2026-12-05-tail-first.md).
        """
        need_bytes = self.pool.bytes_used + self.pool.new_bytes(chain, sizes)
        need_bytes -= self._budget.max_bytes
        need_entries = len(self._entries) + (old is None) - self._budget.max_entries
        keep, left = set(chain), dict[str, int]()
        victims: list[CacheEntry] = []
        kept = 0
        for key in self._policy.order():
            if need_bytes <= 0 and need_entries <= 0:
                break
            if old is not None and key == old.prefix_hash:
                continue
            victim = self._entries[key]
            victims.append(victim)
            if need_entries <= 0:  # before `freed_by` counts this victim's blocks in `left`
                kept = self._head_to_keep(victim, need_bytes, left, keep)
            need_bytes -= self.pool.freed_by(victim.block_hashes, left, keep)
            need_entries -= 1
        if need_bytes > 0 or need_entries > 0:
            raise WarmupRefused(
                f"cannot free enough space: {need_bytes} bytes and {need_entries} entries "
                "still missing after every unpinned entry"
            )
        return victims, kept

    def _evict(self, victims: list[CacheEntry], kept: int, command_id: str | None) -> None:
        for victim in victims:
            if kept and victim is victims[-1]:
                self._keep_head(victim, kept, {victim.prefix_hash})
            self._remove(victim.prefix_hash, "evicted", command_id, "capacity", by_policy=True)

    def _head_to_keep(
        self, victim: CacheEntry, need_bytes: int, left: dict[str, int], keep: set[str]
    ) -> int:
        """How many leading blocks of `victim` can stay while its tail frees `need_bytes`
        (`left`: each block's holders left by the victims before it, as `freed_by` counts);
        0 when the whole victim is needed."""
        got, index = 0, victim.n_blocks
        for h in reversed(victim.block_hashes):
            if got >= need_bytes:
                break
            index -= 1
            block = self.pool[h]
            if left.get(h, block.refs) == 1 and h not in keep:
                got += block.nbytes
        return index

    def _place(self, entry: CacheEntry, sizes: list[int], old: CacheEntry | None) -> None:
        if old is not None:
            self._index.remove(old)
            self.pool.change(old.block_hashes, holding(old), holding(entry))
            self.pool.restore(old.prefix_hash, old.block_hashes)
            self._policy.discard(old.prefix_hash)
        else:
            self.pool.hold(
                entry.prefix_hash, entry.tenant, entry.block_hashes, sizes, holding(entry)
            )
        self._stamp[entry.prefix_hash] = next(self._stamps)
        self._entries[entry.prefix_hash] = entry
        self._index.add(entry)
        for ref, start in entry.chunk_starts.items():
            self.pool.mark(entry.block_hashes, ref, start // self.block_size)
        if self.tier is not None:
            self.tier.placed(entry, self.pool, self._entries)
        self._track(entry)

    def _track(self, entry: CacheEntry) -> None:
        """Give the entry to the policy (unpinned) and the expiry heap (with a TTL)."""
        if not entry.pinned and entry.prefix_hash not in self._policy:
            self._policy.add(
                entry.prefix_hash, nbytes=entry.nbytes, n_tokens=entry.n_tokens, hits=entry.hits
            )
        if entry.expires_at is not None:
            heapq.heappush(self._expiry, (entry.expires_at, entry.prefix_hash))

    def _rehold(
        self, entry: CacheEntry, pinned: bool, kind: Kind, expires_at: float | None
    ) -> None:
        """Change an entry's pin, kind and expiry in place, keeping the pool's totals right."""
        before = holding(entry)
        entry.pinned, entry.kind, entry.expires_at = pinned, kind, expires_at
        self.pool.change(entry.block_hashes, before, holding(entry))
        if self.tier is not None and entry.managed and not before.managed:
            self.tier.placed(entry, self.pool, self._entries)  # warm again: write through
        if entry.pinned:
            self._policy.discard(entry.prefix_hash)
        self._track(entry)

    # -- removal ---------------------------------------------------------------------

    def _invalidate(self, stale: Stale, command_id: str | None) -> list[CacheEntry]:
        self.retired.retire(stale.tenant, stale.refs, self._clock())
        listing = {k for r in stale.refs for k in self._index.by_chunk.get(r, ())}
        listing |= {k for c in stale.chunk_ids for k in self._index.by_chunk_id.get(c, ())}
        doomed = doomed_blocks(stale, self.pool, self._entries, listing)
        # Every entry naming a changed chunk leaves, also one ending in a block that the
        # chunk's forks share (no block of it is doomed: its KV stays with theirs).
        listed = {k for k in listing if stale.reaches(self._entries[k])}
        return self._cut(doomed, command_id, "chunk_changed", stale, listed)

    def _cut(
        self, doomed: set[str], command_id: str | None, reason: str, stale: Stale | None = None,
        listed: Iterable[str] = (),
    ) -> list[CacheEntry]:
        """Free the `doomed` blocks and all that follow them in any chain.

        Entries holding one are removed, and the `listed` ones; where what they held before
        a doomed block would be freed too, a request entry ending there keeps it (event
        `stored`, reason `truncated`).
        """
        if self.tier is not None:
            self.tier.cutting(doomed, stale)
        first = first_cuts(doomed, self.pool)
        leaving = set(first).union(listed)
        for key, index in sorted(first.items(), key=lambda kv: self._stamp[kv[0]]):
            if index > 0:
                self._keep_head(self._entries[key], index, leaving, stale)
        return self._remove_all(leaving, "invalidated", command_id, reason)

    def _keep_head(
        self, entry: CacheEntry, index: int, leaving: set[str], stale: Stale | None = None
    ) -> None:
        """Keep `entry`'s first `index` blocks as a request entry unless another holds them
        (listing no chunk of `stale`)."""
        head = entry.block_hashes[:index]
        if self.pool[head[-1]].holders.keys() - leaving:
            return
        sizes = [self.pool[h].nbytes for h in head]
        kept = head_entry(entry, sizes, self.block_size, self._clock(), stale)
        self._place(kept, sizes, None)
        self._record("stored", kept, None, "truncated", kept.created_at)

    def _detach(self, entry: CacheEntry, *, by_policy: bool) -> None:
        del self._entries[entry.prefix_hash], self._stamp[entry.prefix_hash]
        self._gone.append(entry.prefix_hash)
        self._index.remove(entry)
        if by_policy and self.tier is not None:
            self.tier.evicting(entry, self.pool, self._entries)
        self.pool.release(entry.prefix_hash, entry.block_hashes, holding(entry))
        self._policy.discard(entry.prefix_hash, evicted=by_policy)

    def _remove(
        self, key: str, kind: EventKind, command_id: str | None, reason: str,
        *, by_policy: bool = False, at: float | None = None,
    ) -> CacheEntry:
        entry = self._entries[key]
        self._detach(entry, by_policy=by_policy)
        self._record(kind, entry, command_id, reason, self._now(at))
        return entry

    def _remove_all(
        self, keys: set[str], kind: EventKind, command_id: str | None, reason: str
    ) -> list[CacheEntry]:
        # Set order varies between runs; storing order keeps results and events stable.
        ordered = sorted(keys, key=self._stamp.__getitem__)
        t = self._clock()
        return [self._remove(k, kind, command_id, reason, at=t) for k in ordered]

    def _record(
        self, kind: EventKind, entry: CacheEntry, command_id: str | None, reason: str, t: float
    ) -> None:
        self._events.append(
            CacheEvent(
                kind=kind,
                prefix_hash=entry.prefix_hash,
                tenant=entry.tenant,
                n_tokens=entry.n_tokens,
                nbytes=entry.nbytes,
                chunk_refs=entry.chunk_refs,
                at=t,
                command_id=command_id,
                reason=reason,
            )
        )
