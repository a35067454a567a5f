"""Which cached blocks a change reaches: the first block of each chain that passes through it.

Pure functions over the block pool and the entries, used by `PrefixCache` to invalidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workers.block_pool import BlockPool, ChunkKey
from workers.cache_entries import CacheEntry


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
        return any(r in self.refs or r[0] in self.chunk_ids for r in entry.chunk_refs)

    def unplaced_in(self, entry: CacheEntry) -> bool:
        """Whether `entry` lists a changed chunk without saying where it starts."""
        return any(
            (r in self.refs or r[0] in self.chunk_ids) and r not in entry.chunk_starts
            for r in entry.chunk_refs
        )


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
    if stale.tenant is not None:
        doomed = {h for h in doomed if h in pool and any(
            stale.reaches(entries[k]) for k in pool[h].holders if k in entries)}
    for key in listing:
        entry = entries[key]
        if stale.reaches(entry) and stale.unplaced_in(entry):
            doomed.add(entry.block_hashes[inferred_start(entry, stale, pool, entries)])
    return doomed


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
