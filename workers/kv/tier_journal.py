"""What the disk tier must do after changes to the device cache (pure, like its events).

`PrefixCache` tells the journal when it places a managed entry (written through: warm
prefixes must survive a crash), evicts an entry for room (its blocks spill to disk) and
cuts stale blocks (they leave the disk too); the engine drains the journal and does the I/O.
A block's chunk marks travel with it, so invalidating a chunk reaches it on disk as well,
after a restart included.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field

from workers.kv.block_pool import BlockPool, ChunkKey
from workers.kv.entries import CacheEntry, Stale
from workers.kv.tier_index import TierBlock, TierIndex


@dataclass
class TierOps:
    """Blocks to write (their tensors still on the device) and what to drop from disk."""

    writes: dict[str, TierBlock] = field(default_factory=dict)  # of managed entries
    spills: dict[str, TierBlock] = field(default_factory=dict)  # of entries evicted for room
    cut: set[str] = field(default_factory=set)  # hashes whose chains are stale from there on
    refs: set[tuple[str | None, ChunkKey]] = field(default_factory=set)  # (tenant, chunk)
    chunk_ids: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.writes or self.spills or self.cut or self.refs or self.chunk_ids)


@dataclass
class TierChanges:
    """What a tier's storage must do after `absorb`: write these blocks (their headers as
    the index now holds them), and unlink the blocks evicted for room and those dropped as
    stale (unlink first: a block may leave and come back in one round)."""

    write: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    @property
    def unlink(self) -> list[str]:
        return [*self.evicted, *self.dropped]


def absorb(index: TierIndex, ops: TierOps, available: Container[str]) -> TierChanges:
    """Apply `ops` to the tier's index: hold the written and spilled blocks whose KV is
    `available` (a spilled block already held is left as it is: an evicted request entry's
    refs say nothing about the chunks it does not list), then drop what is stale. Pure, so
    the torch engine's tiers and the simulation's (`workers.cost_engine`) keep one book."""
    changes, written = TierChanges(), dict[str, None]()

    def hold(block: TierBlock) -> None:
        h = block.block_hash
        held = index.get(h)
        if held is not None and block.approx and not held.approx:
            index.touch([h])  # the tier's exact KV stays: never overwritten by a blend's
            return
        if held is not None:
            changed = index.narrow(h, block.marks)
            changed = (not block.approx and index.mark_exact(h)) or changed
            if index.mark_end(h, block.end) or changed:  # its header changed
                written[h] = None
            index.touch([h])
        elif index.admissible(block.nbytes):
            changes.evicted += index.add(block)
            written[h] = None

    for h, block in ops.writes.items():
        if h in available:
            hold(block)
    for h, block in ops.spills.items():
        if h in available and h not in index:
            hold(block)
    changes.dropped = index.remove(ops.cut) + index.invalidate(chunk_ids=ops.chunk_ids)
    for tenant in sorted({t for t, _ in ops.refs}, key=str):  # one tenant's edit at a time
        changes.dropped += index.invalidate([r for t, r in ops.refs if t == tenant],
                                            tenant=tenant)
    changes.write = [h for h in written if h in index]
    return changes


class TierJournal:
    """Collects `TierOps` until the engine drains them. `write_through`: a managed entry's
    blocks are written when placed (a disk tier: warm prefixes survive a crash); without it
    only evicted blocks go down (a host tier, which a crash loses anyway: writing every
    warmup through would push out what it spilled, for no gain)."""

    def __init__(self, *, write_through: bool = True) -> None:
        self._ops = TierOps()
        self.write_through = write_through

    def drain(self) -> TierOps:
        ops, self._ops = self._ops, TierOps()
        return ops

    def placed(
        self, entry: CacheEntry, pool: BlockPool, entries: Mapping[str, CacheEntry]
    ) -> None:
        """A managed entry was stored or refreshed: write its blocks through. Its chunk refs
        are taken as complete (as the device's invalidation takes them), so its blocks also
        narrow the marks of blocks already on disk."""
        if entry.managed and self.write_through:
            self._write(self._ops.writes, entry, range(entry.n_blocks), pool, entries)

    def evicting(
        self, entry: CacheEntry, pool: BlockPool, entries: Mapping[str, CacheEntry]
    ) -> None:
        """`entry` is about to leave for room: the blocks only it holds spill to disk."""
        only = [i for i, h in enumerate(entry.block_hashes) if pool[h].refs == 1]
        self._write(self._ops.spills, entry, only, pool, entries)

    def cutting(self, doomed: set[str], stale: Stale | None) -> None:
        """Blocks `doomed` (and all after them) are stale; so is whatever `stale` names."""
        self._ops.cut |= doomed
        # Stale blocks queued in this same round (and those after them) need no writing.
        gone = set(doomed)
        for queue in (self._ops.writes, self._ops.spills):
            for h, block in list(queue.items()):  # chains are queued head first
                if h in gone or block.parent in gone:
                    gone.add(h)
                    del queue[h]
        if stale is not None:
            self._ops.refs |= {(stale.tenant, r) for r in stale.refs}
            self._ops.chunk_ids |= stale.chunk_ids

    def _write(
        self,
        queue: dict[str, TierBlock],
        entry: CacheEntry,
        indexes: range | list[int],
        pool: BlockPool,
        entries: Mapping[str, CacheEntry],
    ) -> None:
        marks = chain_marks(entry, pool, entries)
        chain = entry.block_hashes
        for i in indexes:
            h = chain[i]
            parent = chain[i - 1] if i else None
            old = queue.get(h)
            both = marks[i] & old.marks if old is not None else marks[i]
            end = h == entry.prefix_hash or (old is not None and old.end)
            queue[h] = TierBlock(h, parent, entry.tenant, pool[h].nbytes, both, end,
                                 approx=pool[h].approx)


def chain_marks(
    entry: CacheEntry, pool: BlockPool, entries: Mapping[str, CacheEntry]
) -> list[frozenset[ChunkKey]]:
    """The chunks each block of `entry`'s chain passes through: the pool's exact marks, and
    each listed chunk from where it starts (given at admission, else inferred as the
    device cache's invalidation would place it)."""
    block_size = max(1, entry.n_tokens // max(1, entry.n_blocks))
    starts: dict[ChunkKey, int] = {}
    for ref in entry.chunk_refs:
        if ref in entry.chunk_starts:
            starts[ref] = entry.chunk_starts[ref] // block_size
        else:
            starts[ref] = _inferred_start(entry, ref[0], pool, entries)
    return [
        frozenset(pool[h].through | {r for r, s in starts.items() if i >= s})
        for i, h in enumerate(entry.block_hashes)
    ]


def _inferred_start(
    entry: CacheEntry, chunk_id: str, pool: BlockPool, entries: Mapping[str, CacheEntry]
) -> int:
    """`workers.kv.entries.inferred_start` for one chunk, erring early: a block held by an
    entry not extending `entry` that lists no version of the chunk precedes it; holders
    that are not entries (an admission in progress) prove nothing."""
    extending = pool[entry.prefix_hash].holders
    for index, h in enumerate(entry.block_hashes):
        if not any(
            g not in extending and g in entries and _lists_no(entries[g], chunk_id)
            for g in pool[h].holders
        ):
            return index
    return len(entry.block_hashes) - 1


def _lists_no(entry: CacheEntry, chunk_id: str) -> bool:
    return all(r[0] != chunk_id for r in entry.chunk_refs)
