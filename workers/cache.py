"""Pure KV-cache prefix bookkeeping: index, dependencies, TTL, budgets."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from workers.blocks import BLOCK_SIZE
from workers.eviction import EvictionPolicy, make_policy
from workers.memory import Budget

ChunkKey = tuple[str, str]
_K = TypeVar("_K")
EventKind = Literal["stored", "evicted", "invalidated", "ttl_extended", "cleared", "released"]


@dataclass
class CacheEntry:
    """One cached prefix; the cache owns it, callers should treat it as read-only."""

    prefix_hash: str
    tenant: str
    block_hashes: tuple[str, ...]
    n_tokens: int
    nbytes: int
    chunk_refs: frozenset[ChunkKey]
    pinned: bool
    created_at: float
    last_used: float
    expires_at: float | None
    hits: int = 0

    @property
    def n_blocks(self) -> int:
        return len(self.block_hashes)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


@dataclass(frozen=True)
class CacheEvent:
    """A change to the cache, queued for the worker to publish on `worker.events`."""

    kind: EventKind
    prefix_hash: str
    tenant: str
    n_tokens: int
    nbytes: int
    chunk_refs: frozenset[ChunkKey]
    at: float
    command_id: str | None = None
    # Why an entry left: "capacity", "expired", "explicit", "chunk_changed", "prefix"...
    reason: str = ""


class WarmupRefused(Exception):
    """An admission that cannot fit the budget; `reason` says which bound refused it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Holders are insertion-ordered dicts used as sets, so "most recently stored" is O(1).
Holders = dict[str, None]


@dataclass
class _Indexes:
    """Reverse indexes from block hash and chunk identity to prefix hashes."""

    by_block: dict[str, Holders] = field(default_factory=dict)
    by_chunk: dict[ChunkKey, Holders] = field(default_factory=dict)
    by_chunk_id: dict[str, Holders] = field(default_factory=dict)

    def add(self, entry: CacheEntry) -> None:
        key = entry.prefix_hash
        for h in entry.block_hashes:
            self.by_block.setdefault(h, {})[key] = None
        for ref in entry.chunk_refs:
            self.by_chunk.setdefault(ref, {})[key] = None
            self.by_chunk_id.setdefault(ref[0], {})[key] = None

    def remove(self, entry: CacheEntry) -> None:
        key = entry.prefix_hash
        for h in entry.block_hashes:
            _discard(self.by_block, h, key)
        for ref in entry.chunk_refs:
            _discard(self.by_chunk, ref, key)
            _discard(self.by_chunk_id, ref[0], key)


def _discard(index: dict[_K, Holders], key: _K, value: str) -> None:
    holders = index.get(key)
    if holders is not None:
        holders.pop(value, None)
        if not holders:
            del index[key]


class PrefixCache:
    """Index of cached prefixes with dependencies, TTLs, pins, budgets and an event queue.

    Hashes passed in must be chains from `block_hashes`: a block hash then identifies its
    whole leading chain, which is what makes lookup a binary search over dict probes.
    """

    def __init__(
        self,
        budget: Budget,
        *,
        policy: str = "lru",
        clock: Callable[[], float] = time.monotonic,
        default_ttl_s: float | None = 3600.0,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        if default_ttl_s is not None and default_ttl_s <= 0:
            raise ValueError(f"default_ttl_s must be > 0 or None, got {default_ttl_s}")
        self._budget = budget
        self.block_size = block_size
        self.default_ttl_s = default_ttl_s
        self._policy: EvictionPolicy = make_policy(policy)
        self._clock = clock
        self._entries: dict[str, CacheEntry] = {}
        self._stamp: dict[str, int] = {}
        self._stamps = itertools.count()
        self._index = _Indexes()
        self._expiry: list[tuple[float, str]] = []
        self._events: list[CacheEvent] = []
        self._bytes_used = 0
        self._pinned_bytes = 0

    # -- read side -------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        return self._budget

    @property
    def policy_name(self) -> str:
        return self._policy.name

    @property
    def bytes_used(self) -> int:
        return self._bytes_used

    @property
    def pinned_bytes(self) -> int:
        return self._pinned_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, prefix_hash: object) -> bool:
        return prefix_hash in self._entries

    def get(self, prefix_hash: str, *, now: float | None = None) -> CacheEntry | None:
        """The live entry stored under `prefix_hash`, without touching it."""
        entry = self._entries.get(prefix_hash)
        if entry is None or entry.expired(self._now(now)):
            return None
        return entry

    def entries(self) -> list[CacheEntry]:
        return list(self._entries.values())

    def warm_prefixes(self) -> list[str]:
        """Prefix hashes of the pinned (warmup-owned) entries."""
        return [k for k, e in self._entries.items() if e.pinned]

    def lookup(
        self, hashes: Sequence[str], *, now: float | None = None
    ) -> tuple[CacheEntry | None, int]:
        """The entry sharing the longest leading run of `hashes`, and that run's length.

        Expired entries are removed first (event `evicted`, reason `expired`). The
        returned entry is touched: `last_used`, `hits` and the eviction policy.
        """
        t = self._now(now)
        self.expire(t)
        entry, matched = self._match(hashes, t)
        if entry is not None:
            entry.last_used = t
            entry.hits += 1
            self._policy.touch(entry.prefix_hash)
        return entry, matched

    def peek(
        self, hashes: Sequence[str], *, now: float | None = None
    ) -> tuple[CacheEntry | None, int]:
        """Like `lookup`, without side effects (expired entries are skipped, not removed)."""
        return self._match(hashes, self._now(now))

    def drain_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

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
    ) -> tuple[CacheEntry, list[CacheEntry]]:
        """Store a prefix (or refresh the identical one), evicting by policy to fit.

        Returns (entry, evicted). Nothing changes when it raises `WarmupRefused`.
        A refresh never shortens the expiry nor unpins; it records a `stored` event
        only when the pin, size or chunk refs changed.
        """
        chain = tuple(hashes)
        _check_admission(chain, nbytes, ttl_s)
        t = self._clock()
        self.expire(t)
        old = self._entries.get(chain[-1])
        if old is not None and old.tenant != tenant:
            raise ValueError(f"prefix {chain[-1]} belongs to tenant {old.tenant!r}, not {tenant!r}")
        pinned = pin or (old is not None and old.pinned)
        self._check_fit(nbytes, pinned, old)
        victims = self._plan_eviction(nbytes, old)
        for victim in victims:
            self._remove(victim.prefix_hash, "evicted", command_id, "capacity", by_policy=True)
        entry = self._build(tenant, chain, nbytes, frozenset(chunk_refs), pinned, ttl_s, t, old)
        if old is not None:
            self._detach(old, by_policy=False)
        self._attach(entry)
        if old is None or _observable(old) != _observable(entry):
            self._record("stored", entry, command_id, "", t)
        return entry, victims

    def invalidate(
        self, chunk_refs: Iterable[ChunkKey], *, command_id: str | None = None
    ) -> list[CacheEntry]:
        """Remove every entry built from any of `chunk_refs` (idempotent)."""
        keys: set[str] = set()
        for ref in chunk_refs:
            keys.update(self._index.by_chunk.get(ref, ()))
        return self._remove_all(keys, "invalidated", command_id, "chunk_changed")

    def invalidate_chunks(
        self, chunk_ids: Iterable[str], *, command_id: str | None = None
    ) -> list[CacheEntry]:
        """Remove every entry built from any of `chunk_ids`, whatever the content hash."""
        keys: set[str] = set()
        for chunk_id in chunk_ids:
            keys.update(self._index.by_chunk_id.get(chunk_id, ()))
        return self._remove_all(keys, "invalidated", command_id, "chunk_changed")

    def invalidate_prefix(
        self, prefix_hash: str, *, command_id: str | None = None
    ) -> list[CacheEntry]:
        """Remove the entries whose chain contains `prefix_hash` (it and its extensions)."""
        keys = set(self._index.by_block.get(prefix_hash, ()))
        return self._remove_all(keys, "invalidated", command_id, "prefix")

    def extend_ttl(
        self,
        prefix_hash: str,
        ttl_s: float,
        *,
        now: float | None = None,
        command_id: str | None = None,
    ) -> CacheEntry | None:
        """Push the expiry to at least now + ttl_s; None when the entry is gone."""
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        t = self._now(now)
        self.expire(t)
        entry = self._entries.get(prefix_hash)
        if entry is None:
            return None
        if entry.expires_at is not None and entry.expires_at < t + ttl_s:
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
            entry.pinned = False
            self._pinned_bytes -= entry.nbytes
            self._policy.add(
                prefix_hash, nbytes=entry.nbytes, n_tokens=entry.n_tokens, hits=entry.hits
            )
        self._record("released", entry, command_id, "", self._clock())
        return entry

    def evict(
        self, prefix_hashes: Iterable[str], *, command_id: str | None = None
    ) -> list[CacheEntry]:
        """Remove the named entries, pinned or not (an explicit order, not policy)."""
        keys = {k for k in prefix_hashes if k in self._entries}
        return self._remove_all(keys, "evicted", command_id, "explicit")

    def expire(self, now: float | None = None) -> list[CacheEntry]:
        """Remove entries whose TTL has passed, pinned ones included (the TTL is their lease)."""
        t = self._now(now)
        removed: list[CacheEntry] = []
        while self._expiry and self._expiry[0][0] <= t:
            at, key = heapq.heappop(self._expiry)
            entry = self._entries.get(key)
            # Stale heap items (extended or removed entries) are skipped lazily.
            if entry is not None and entry.expires_at == at:
                removed.append(self._remove(key, "evicted", None, "expired", at=t))
        return removed

    def clear(self, *, command_id: str | None = None) -> list[CacheEntry]:
        """Remove everything, one `cleared` event per entry."""
        return self._remove_all(set(self._entries), "cleared", command_id, "cleared")

    # -- internals -------------------------------------------------------------------

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _match(self, hashes: Sequence[str], t: float) -> tuple[CacheEntry | None, int]:
        # Chains make "some live entry holds hashes[k-1]" monotone in k: binary search.
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._any_live(hashes[mid - 1], t):
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return None, 0
        return self._best_holder(hashes[lo - 1], t), lo

    def _any_live(self, block_hash: str, t: float) -> bool:
        holders = self._index.by_block.get(block_hash, ())
        return any(not self._entries[k].expired(t) for k in holders)

    def _best_holder(self, block_hash: str, t: float) -> CacheEntry:
        # The entry ending exactly there, else the most recently stored holder: O(1) even
        # when thousands of entries share a system prompt, and deterministic.
        exact = self._entries.get(block_hash)
        if exact is not None and not exact.expired(t):
            return exact
        holders = reversed(self._index.by_block[block_hash])
        return next(e for e in map(self._entries.__getitem__, holders) if not e.expired(t))

    def _check_fit(self, nbytes: int, pinned: bool, old: CacheEntry | None) -> None:
        budget = self._budget
        if budget.max_entries < 1:
            raise WarmupRefused("the cache budget allows no entries (max_entries=0)")
        if nbytes > budget.max_bytes:
            raise WarmupRefused(f"entry of {nbytes} bytes exceeds max_bytes={budget.max_bytes}")
        if pinned:
            already = old.nbytes if old is not None and old.pinned else 0
            after = self._pinned_bytes - already + nbytes
            if after > budget.warm_bytes:
                raise WarmupRefused(
                    f"pinned bytes would reach {after}, over warm_bytes={budget.warm_bytes}"
                )

    def _plan_eviction(self, nbytes: int, old: CacheEntry | None) -> list[CacheEntry]:
        need_bytes = self._bytes_used + nbytes - self._budget.max_bytes
        need_entries = len(self._entries) + 1 - self._budget.max_entries
        if old is not None:
            need_bytes -= old.nbytes
            need_entries -= 1
        victims: list[CacheEntry] = []
        for key in self._policy.order():
            if need_bytes <= 0 and need_entries <= 0:
                break
            if old is not None and key == old.prefix_hash:
                continue
            victim = self._entries[key]
            victims.append(victim)
            need_bytes -= victim.nbytes
            need_entries -= 1
        if need_bytes > 0 or need_entries > 0:
            raise WarmupRefused(
                f"cannot free enough space: {need_bytes} bytes and {need_entries} entries "
                "still missing after every unpinned entry"
            )
        return victims

    def _build(
        self,
        tenant: str,
        chain: tuple[str, ...],
        nbytes: int,
        refs: frozenset[ChunkKey],
        pinned: bool,
        ttl_s: float | None,
        t: float,
        old: CacheEntry | None,
    ) -> CacheEntry:
        ttl = ttl_s if ttl_s is not None else self.default_ttl_s
        expires_at = None if ttl is None else t + ttl
        if old is not None:
            expires_at = _later(old.expires_at, expires_at)
        return CacheEntry(
            prefix_hash=chain[-1],
            tenant=tenant,
            block_hashes=chain,
            n_tokens=len(chain) * self.block_size,
            nbytes=nbytes,
            chunk_refs=refs,
            pinned=pinned,
            created_at=old.created_at if old is not None else t,
            last_used=t,
            expires_at=expires_at,
            hits=old.hits if old is not None else 0,
        )

    def _attach(self, entry: CacheEntry) -> None:
        key = entry.prefix_hash
        self._entries[key] = entry
        self._stamp[key] = next(self._stamps)
        self._index.add(entry)
        self._bytes_used += entry.nbytes
        if entry.pinned:
            self._pinned_bytes += entry.nbytes
        else:
            self._policy.add(key, nbytes=entry.nbytes, n_tokens=entry.n_tokens, hits=entry.hits)
        if entry.expires_at is not None:
            heapq.heappush(self._expiry, (entry.expires_at, key))

    def _detach(self, entry: CacheEntry, *, by_policy: bool) -> None:
        del self._entries[entry.prefix_hash], self._stamp[entry.prefix_hash]
        self._index.remove(entry)
        self._bytes_used -= entry.nbytes
        if entry.pinned:
            self._pinned_bytes -= entry.nbytes
        self._policy.discard(entry.prefix_hash, evicted=by_policy)

    def _remove(
        self,
        key: str,
        kind: EventKind,
        command_id: str | None,
        reason: str,
        *,
        by_policy: bool = False,
        at: float | None = None,
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


def _check_admission(chain: tuple[str, ...], nbytes: int, ttl_s: float | None) -> None:
    if not chain:
        raise ValueError("admit needs at least one full block hash")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if ttl_s is not None and ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0 or None, got {ttl_s}")


def _observable(entry: CacheEntry) -> tuple[bool, int, frozenset[ChunkKey]]:
    """What subscribers of `stored` events see change on a refresh."""
    return entry.pinned, entry.nbytes, entry.chunk_refs


def _later(a: float | None, b: float | None) -> float | None:
    """The later of two expiries, None meaning never."""
    if a is None or b is None:
        return None
    return max(a, b)
