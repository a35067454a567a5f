"""Prefix entries of the KV cache, their events and refusals, and how one is built (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from workers.block_pool import ChunkKey, Holders, Holding

_K = TypeVar("_K")
Kind = Literal["managed", "request"]
EventKind = Literal["stored", "evicted", "invalidated", "ttl_extended", "cleared", "released"]


@dataclass
class CacheEntry:
    """One cached prefix; the cache owns it, callers should treat it as read-only."""

    prefix_hash: str
    tenant: str
    block_hashes: tuple[str, ...]
    n_tokens: int
    nbytes: int  # bytes of all its blocks, shared ones included
    chunk_refs: frozenset[ChunkKey]
    pinned: bool
    created_at: float
    last_used: float
    expires_at: float | None
    hits: int = 0
    kind: Kind = "managed"
    # Token offset where each chunk starts in the prompt, for the refs that gave one.
    chunk_starts: Mapping[ChunkKey, int] = field(default_factory=dict)

    @property
    def n_blocks(self) -> int:
        return len(self.block_hashes)

    @property
    def managed(self) -> bool:
        return self.kind == "managed"

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
    # Why: "capacity", "expired", "explicit", "chunk_changed", "prefix", "truncated"...
    reason: str = ""


class WarmupRefused(Exception):
    """An admission that cannot fit the budget; `reason` says which bound refused it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ChunkIndex:
    """Reverse indexes from chunk identity to the prefix hashes of entries listing it."""

    by_chunk: dict[ChunkKey, Holders] = field(default_factory=dict)
    by_chunk_id: dict[str, Holders] = field(default_factory=dict)

    def add(self, entry: CacheEntry) -> None:
        for ref in entry.chunk_refs:
            self.by_chunk.setdefault(ref, {})[entry.prefix_hash] = None
            self.by_chunk_id.setdefault(ref[0], {})[entry.prefix_hash] = None

    def remove(self, entry: CacheEntry) -> None:
        for ref in entry.chunk_refs:
            discard(self.by_chunk, ref, entry.prefix_hash)
            discard(self.by_chunk_id, ref[0], entry.prefix_hash)


def discard(index: dict[_K, Holders], key: _K, value: str) -> None:
    holders = index.get(key)
    if holders is not None:
        holders.pop(value, None)
        if not holders:
            del index[key]


@dataclass(frozen=True)
class Asked:
    """What an admission asks for: a pin, the kind of residency and a TTL."""

    pin: bool
    kind: Kind
    ttl_s: float | None


def build_entry(
    chain: tuple[str, ...],
    tenant: str,
    sizes: tuple[int, int],
    refs: frozenset[ChunkKey],
    starts: dict[ChunkKey, int],
    asked: Asked,
    default_ttl_s: float | None,
    t: float,
    old: CacheEntry | None,
) -> CacheEntry:
    """The entry an admission stores; `sizes` is (bytes of the chain, tokens per block).

    A refresh (`old`) keeps identity, hits and pin; a managed entry never loses its lease
    to a shorter TTL, and a request over it keeps its lease and adds its refs.
    """
    was_managed = old is not None and old.managed
    if asked.kind == "request":
        expires_at = old.expires_at if old is not None and was_managed else None
        if old is not None and was_managed:
            # What the request says it was built from still counts for invalidation.
            refs, starts = old.chunk_refs | refs, {**starts, **old.chunk_starts}
    else:
        ttl = asked.ttl_s if asked.ttl_s is not None else default_ttl_s
        expires_at = None if ttl is None else t + ttl
        if old is not None and was_managed:
            expires_at = later(old.expires_at, expires_at)
    nbytes, block_size = sizes
    return CacheEntry(
        prefix_hash=chain[-1],
        tenant=tenant,
        block_hashes=chain,
        n_tokens=len(chain) * block_size,
        nbytes=nbytes,
        chunk_refs=refs,
        pinned=asked.pin or (old is not None and old.pinned),
        created_at=old.created_at if old is not None else t,
        last_used=t,
        expires_at=expires_at,
        hits=old.hits if old is not None else 0,
        kind="managed" if asked.kind == "managed" or was_managed else "request",
        chunk_starts=starts,
    )


def head_entry(entry: CacheEntry, sizes: list[int], block_size: int, t: float) -> CacheEntry:
    """A request entry for the first `len(sizes)` blocks of `entry` (what survives a cut)."""
    index = len(sizes)
    starts = {r: s for r, s in entry.chunk_starts.items() if s < index * block_size}
    return CacheEntry(
        prefix_hash=entry.block_hashes[index - 1],
        tenant=entry.tenant,
        block_hashes=entry.block_hashes[:index],
        n_tokens=index * block_size,
        nbytes=sum(sizes),
        chunk_refs=frozenset(starts),
        pinned=False,
        created_at=t,
        last_used=entry.last_used,
        expires_at=None,
        kind="request",
        chunk_starts=starts,
    )


def holding(entry: CacheEntry) -> Holding:
    return Holding(pinned=entry.pinned, managed=entry.managed)


def check_admission(chain: tuple[str, ...], nbytes: int, ttl_s: float | None) -> None:
    if not chain:
        raise ValueError("admit needs at least one full block hash")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if ttl_s is not None and ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0 or None, got {ttl_s}")


def observable(entry: CacheEntry) -> tuple[bool, str, int, frozenset[ChunkKey]]:
    """What subscribers of `stored` events see change on a refresh."""
    return entry.pinned, entry.kind, entry.nbytes, entry.chunk_refs


def later(a: float | None, b: float | None) -> float | None:
    """The later of two expiries, None meaning never."""
    if a is None or b is None:
        return None
    return max(a, b)
