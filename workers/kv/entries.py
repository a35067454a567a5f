"""Prefix entries of the KV cache (pure): what one is, its events and refusals (among them a
request naming a chunk version invalidated while it waited), how one is built, and which
entries and blocks a change to chunks reaches (the cuts `PrefixCache` invalidates and the
disk tier's journal follows)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from workers.kv.block_pool import BlockPool, ChunkKey, Holders, Holding

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
            # What the request says it was built from still counts for invalidation; a
            # ref both name starts at the earlier block (so invalidation cuts from there).
            merged = {**starts, **old.chunk_starts}
            for ref, start in starts.items():
                merged[ref] = min(start, merged[ref])
            refs, starts = old.chunk_refs | refs, merged
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


def head_entry(
    entry: CacheEntry, sizes: list[int], block_size: int, t: float, stale: Stale | None = None
) -> CacheEntry:
    """A request entry for the first `len(sizes)` blocks of `entry` (what survives a cut).

    It lists the chunks that start within those blocks, but not one `stale` changed: a head
    kept through a change ends in the block the changed chunk shares with its forks (the
    same tokens in every version), so it holds none of the changed version's own KV.
    """
    index = len(sizes)
    starts = {r: s for r, s in entry.chunk_starts.items()
              if s < index * block_size and not (stale is not None and stale.changed(r))}
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


# -- chunk versions retired lately ---------------------------------------------------------
# Chunk versions a worker invalidated lately, so a request computed from one is not cached.
#
# A RAG request retrieves its chunks, then waits for the engine; an invalidation of one of
# those chunk versions can run on the worker in between. Request caching would then store
# the prompt's KV after the invalidation that should have removed it, and the stale entry
# would outlive every command sent for the edit (`bench faults` counted it as a lost
# invalidation under load). So a request's admission naming a version retired in the last
# `hold_s` is refused: its answer was computed as asked, only its caching is skipped.
#
# Warm prefixes are the streams app's decisions, made from its current docs table: their
# admission is never refused here, and it lifts the mark (an edit reverted to an earlier
# text makes that chunk version current again). The marks expire after `hold_s`, longer than
# any request waits for the engine, and at most `max_marks` are kept.

HOLD_S = 300.0
MAX_MARKS = 65_536


class Retired:
    """Invalidated chunk versions by (tenant, chunk), each with when it was retired."""

    def __init__(self, hold_s: float = HOLD_S, max_marks: int = MAX_MARKS) -> None:
        self.hold_s, self.max_marks = hold_s, max_marks
        self._marks: OrderedDict[tuple[str | None, ChunkKey], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._marks)

    def retire(self, tenant: str | None, refs: Iterable[ChunkKey], now: float) -> None:
        """Mark `refs` invalidated at `now`, of `tenant` (None: of every tenant)."""
        for ref in refs:
            key = (tenant, ref)
            self._marks.pop(key, None)
            self._marks[key] = now
        while len(self._marks) > self.max_marks:
            self._marks.popitem(last=False)

    def admitting(self, tenant: str, refs: Iterable[ChunkKey], request: bool,
                  now: float) -> None:
        """Check an admission naming `refs`: a request's that names a version retired less
        than `hold_s` ago raises `WarmupRefused`; a warm prefix's lifts the marks it names."""
        self._expire(now)
        for ref in refs:
            keys = ((tenant, ref), (None, ref))
            if not request:
                for key in keys:
                    self._marks.pop(key, None)
            elif any(key in self._marks for key in keys):
                raise WarmupRefused(f"chunk {ref[0]}@{ref[1][:12]} was invalidated while the "
                                    "request waited; its KV is not cached")

    def _expire(self, now: float) -> None:
        while self._marks:
            key, at = next(iter(self._marks.items()))
            if at > now - self.hold_s:
                return
            del self._marks[key]


def observable(entry: CacheEntry) -> tuple[bool, str, int, frozenset[ChunkKey]]:
    """What subscribers of `stored` events see change on a refresh."""
    return entry.pinned, entry.kind, entry.nbytes, entry.chunk_refs


def later(a: float | None, b: float | None) -> float | None:
    """The later of two expiries, None meaning never."""
    if a is None or b is None:
        return None
    return max(a, b)


# Which blocks a change reaches: the first block of each chain that passes through it.
@dataclass(frozen=True)
class Stale:
    """Which entries and blocks a set of changed chunks reaches."""

    refs: frozenset[ChunkKey] = frozenset()
    chunk_ids: frozenset[str] = frozenset()
    # Whose KB changed (None: every tenant's). Chunk ids and text repeat across tenants, and
    # one tenant's edit must not evict another's prefixes: chains are salted by tenant, so
    # a block belongs to the one tenant of the entries holding it.
    tenant: str | None = None

    def reaches(self, entry: CacheEntry) -> bool:
        return self.tenant is None or entry.tenant == self.tenant

    def listed_by(self, entry: CacheEntry) -> bool:
        return any(map(self.changed, entry.chunk_refs))

    def changed(self, ref: ChunkKey) -> bool:
        return ref in self.refs or ref[0] in self.chunk_ids

    def unplaced_in(self, entry: CacheEntry) -> bool:
        """Whether `entry` lists a changed chunk without saying where it starts."""
        return any(self.changed(r) and r not in entry.chunk_starts for r in entry.chunk_refs)


def doomed_blocks(
    stale: Stale, pool: BlockPool, entries: Mapping[str, CacheEntry], listing: Iterable[str]
) -> set[str]:
    """The first block of every chain that passes through a changed chunk.

    Blocks marked at admission (refs given with a position) are exact; for the entries in
    `listing` that name a changed chunk without a position, `inferred_start` places it.
    """
    doomed: set[str] = set()
    for ref in stale.refs:
        doomed |= pool.marked(ref)
    for chunk_id in stale.chunk_ids:
        doomed |= pool.marked_id(chunk_id)
    doomed = _past_fork(doomed, pool, entries, stale.changed)
    if stale.tenant is not None:
        doomed = {h for h in doomed if h in pool and any(
            stale.reaches(entries[k]) for k in pool[h].holders if k in entries)}
    for key in listing:
        entry = entries[key]
        if stale.reaches(entry) and stale.unplaced_in(entry):
            doomed.add(entry.block_hashes[inferred_start(entry, stale, pool, entries)])
    return doomed


def _past_fork(
    marked: set[str], pool: BlockPool, entries: Mapping[str, CacheEntry],
    changed: Callable[[ChunkKey], bool],
) -> set[str]:
    """The `marked` blocks that only chains through the changed chunk go on from.

    A chunk rarely starts on a block boundary: the block holding its first tokens also holds
    the end of what precedes it, and prompts whose next chunk opens with the same tokens (a
    chunk opens with its id, which starts with its document's path) share that block and
    fork after it. Its KV is the same in every one of them (hashes are over token ids), so
    it stays, and so do the forks' chains;
    the changed chunk's own chains are cut from their next block, the first it marks alone.
    A fork is known only where the next block's chunks are (marked with positions): a
    chain stored without them may pass through the chunk, so it does not save the block.
    """
    def forks(h: str) -> bool:
        block = pool[h]
        for key in block.holders:
            entry = entries.get(key)
            if entry is None or block.index + 1 >= entry.n_blocks:
                continue
            after = pool.get(entry.block_hashes[block.index + 1])
            if after is not None and after.through and not any(map(changed, after.through)):
                return True
        return False

    return {h for h in marked if h in pool and not forks(h)}


def inferred_start(
    entry: CacheEntry, stale: Stale, pool: BlockPool, entries: Mapping[str, CacheEntry]
) -> int:
    """Where a changed chunk listed without a position starts in `entry`'s chain.

    The leading blocks that some entry holds which lists no changed chunk and does not
    extend `entry` precede it (they match a prompt without it); the rest pass through.
    With no such entry, the whole chain is taken to pass through it.
    """
    extending = pool[entry.prefix_hash].holders
    for index, h in enumerate(entry.block_hashes):
        if not any(g not in extending and not stale.listed_by(entries[g]) for g in pool[h].holders):
            return index
    return len(entry.block_hashes) - 1  # unreachable: `entry` extends itself


def first_cuts(doomed: Iterable[str], pool: BlockPool) -> dict[str, int]:
    """Entry key -> index of the first doomed block in its chain, for every entry reached."""
    first: dict[str, int] = {}
    for h in doomed:
        block = pool.get(h)
        if block is None:
            continue
        for key in block.holders:
            first[key] = min(first.get(key, block.index), block.index)
    return first
