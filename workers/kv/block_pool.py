"""Pure block pool: one record per cached KV block, shared by every entry whose chain holds it.

A block is addressed by its chain hash (`workers.kv.blocks.block_hashes`), so one hash names the
block and its whole leading chain. Entries (prefixes) hold blocks; a block's bytes count once
however many entries hold it, and it leaves the pool when its last holder does. The pool
records which hashes left so the engine can drop their tensors (it keeps no tensors itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

ChunkKey = tuple[str, str]
# Holders are insertion-ordered dicts used as sets, so "most recently stored" is O(1).
Holders = dict[str, None]
_K = TypeVar("_K")


@dataclass
class Block:
    """One cached block: its place in the chain, its size and the entries that hold it."""

    block_hash: str
    index: int
    tenant: str
    nbytes: int
    holders: Holders = field(default_factory=dict)
    pins: int = 0  # holders that are pinned
    managed: int = 0  # holders that warmup manages (the rest are request caching)
    # Chunk refs this block's chain is known to pass through (from refs given with a position).
    through: set[ChunkKey] = field(default_factory=set)
    # Its KV came from a blend (approximate), or extends a block whose KV did: a hit reads
    # it like any block, but it donates no chunk KV; a tier keeps the mark (`TierBlock.approx`).
    approx: bool = False

    @property
    def refs(self) -> int:
        return len(self.holders)


@dataclass(frozen=True)
class PoolStats:
    """What `/v1/cache` and the metrics report about blocks."""

    blocks: int
    shared_blocks: int
    managed_blocks: int
    request_blocks: int
    pinned_blocks: int
    bytes: int
    managed_bytes: int
    request_bytes: int
    pinned_bytes: int


@dataclass(frozen=True)
class Holding:
    """How one entry holds its blocks: pinned and/or managed."""

    pinned: bool
    managed: bool


class BlockPool:
    """Blocks by chain hash, with reference counts, byte totals and chunk marks."""

    def __init__(self) -> None:
        self._blocks: dict[str, Block] = {}
        self._by_chunk: dict[ChunkKey, set[str]] = {}
        self._by_chunk_id: dict[str, set[str]] = {}
        self._freed: list[str] = []  # for the engine's next plan (`PrefixCache.take_plan`)
        self.bytes_used = 0
        self.pinned_bytes = 0
        self.managed_bytes = 0
        self._n_shared = 0
        self._n_managed = 0
        self._n_pinned = 0
        # Per tenant (a block has one: chains are salted by tenant), for the tenant quota.
        self.pinned_by_tenant: dict[str, int] = {}
        self.managed_by_tenant: dict[str, int] = {}

    # -- read side -------------------------------------------------------------------

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, block_hash: str) -> Block | None:
        return self._blocks.get(block_hash)

    def __getitem__(self, block_hash: str) -> Block:
        return self._blocks[block_hash]

    def blocks(self) -> list[Block]:
        return list(self._blocks.values())

    def new_bytes(self, chain: Sequence[str], nbytes: Sequence[int]) -> int:
        """Bytes the blocks of `chain` not yet here would add."""
        return sum(n for h, n in zip(chain, nbytes, strict=True) if h not in self._blocks)

    def freed_by(self, chain: Sequence[str], left: dict[str, int], keep: set[str]) -> int:
        """Bytes evicting the entry holding `chain` frees after the victims before it
        (`left` counts each block's holders left; blocks in `keep` stay)."""
        freed = 0
        for h in chain:
            block = self._blocks[h]
            left[h] = left.get(h, block.refs) - 1
            if left[h] == 0 and h not in keep:
                freed += block.nbytes
        return freed

    def unmanaged_bytes(self, chain: Sequence[str], nbytes: Sequence[int]) -> int:
        """Bytes of `chain` not yet held by any managed (pinned or TTL-held) entry."""
        return sum(
            n for h, n in zip(chain, nbytes, strict=True)
            if (b := self._blocks.get(h)) is None or b.managed == 0
        )

    def unpinned_bytes(self, chain: Sequence[str], nbytes: Sequence[int]) -> int:
        """Bytes of `chain` not yet held by a pinned entry (what pinning it would add)."""
        blocks = self._blocks
        return sum(
            n for h, n in zip(chain, nbytes, strict=True) if h not in blocks or blocks[h].pins == 0
        )

    def exact_run(self, chain: Sequence[str]) -> int:
        """How many leading blocks of `chain` are here with exact (not blended) KV."""
        blocks = self._blocks
        return next((i for i, h in enumerate(chain) if h not in blocks or blocks[h].approx),
                    len(chain))

    def marked(self, ref: ChunkKey) -> set[str]:
        return set(self._by_chunk.get(ref, ()))

    def marked_id(self, chunk_id: str) -> set[str]:
        return set(self._by_chunk_id.get(chunk_id, ()))

    def stats(self) -> PoolStats:
        return PoolStats(
            blocks=len(self._blocks),
            shared_blocks=self._n_shared,
            managed_blocks=self._n_managed,
            request_blocks=len(self._blocks) - self._n_managed,
            pinned_blocks=self._n_pinned,
            bytes=self.bytes_used,
            managed_bytes=self.managed_bytes,
            request_bytes=self.bytes_used - self.managed_bytes,
            pinned_bytes=self.pinned_bytes,
        )

    # -- freed hashes, for the engine ------------------------------------------------

    def drain_freed(self) -> list[str]:
        """Hashes that left the pool since the last drain (a hash may have come back since)."""
        freed, self._freed = self._freed, []
        return freed

    # -- write side ------------------------------------------------------------------

    def hold(
        self,
        key: str,
        tenant: str,
        chain: Sequence[str],
        nbytes: Sequence[int],
        holding: Holding,
        approx_from: int | None = None,
    ) -> None:
        """Make entry `key` a holder of every block of `chain`, adding the missing blocks;
        those added from index `approx_from` on hold a blend's KV (`Block.approx`)."""
        approx = False
        for index, (h, n) in enumerate(zip(chain, nbytes, strict=True)):
            block = self._blocks.get(h)
            if block is None:
                # A block already here keeps its KV (the engine stores tensors only for
                # missing blocks), so only a new block can be approximate.
                mark = approx or (approx_from is not None and index >= approx_from)
                block = self._blocks[h] = Block(h, index, tenant, n, approx=mark)
                self.bytes_used += n
            approx = block.approx
            if key not in block.holders:
                block.holders[key] = None
                self._n_shared += block.refs == 2
                self._count(block, holding, +1)

    def release(self, key: str, chain: Iterable[str], holding: Holding) -> list[str]:
        """Drop entry `key` as a holder of `chain`; returns the hashes that left the pool."""
        freed: list[str] = []
        for h in chain:
            block = self._blocks[h]
            if key not in block.holders:
                continue
            self._count(block, holding, -1)
            self._n_shared -= block.refs == 2
            del block.holders[key]
            if not block.holders:
                self._free(block)
                freed.append(h)
        return freed

    def change(self, chain: Iterable[str], old: Holding, new: Holding) -> None:
        """An entry holding `chain` was pinned, unpinned, demoted or promoted."""
        for h in chain:
            block = self._blocks[h]
            self._count(block, old, -1)
            self._count(block, new, +1)

    def restore(self, key: str, chain: Iterable[str]) -> None:
        """Entry `key` was stored again: it becomes the latest holder of its blocks."""
        for h in chain:
            holders = self._blocks[h].holders
            del holders[key]
            holders[key] = None

    def mark(self, chain: Sequence[str], ref: ChunkKey, first: int) -> None:
        """Record that blocks `first...` of `chain` pass through chunk `ref`."""
        for h in chain[first:]:
            self._blocks[h].through.add(ref)
            self._by_chunk.setdefault(ref, set()).add(h)
            self._by_chunk_id.setdefault(ref[0], set()).add(h)

    def _count(self, block: Block, holding: Holding, step: int) -> None:
        # Totals change when a block gains its first or loses its last such holder.
        edge = 1 if step > 0 else 0
        if holding.pinned:
            block.pins += step
            if block.pins == edge:
                self.pinned_bytes += step * block.nbytes
                self._n_pinned += step
                _add(self.pinned_by_tenant, block.tenant, step * block.nbytes)
        if holding.managed:
            block.managed += step
            if block.managed == edge:
                self.managed_bytes += step * block.nbytes
                self._n_managed += step
                _add(self.managed_by_tenant, block.tenant, step * block.nbytes)

    def _free(self, block: Block) -> None:
        del self._blocks[block.block_hash]
        self.bytes_used -= block.nbytes
        for ref in block.through:
            _discard(self._by_chunk, ref, block.block_hash)
            _discard(self._by_chunk_id, ref[0], block.block_hash)
        self._freed.append(block.block_hash)


def _add(totals: dict[str, int], tenant: str, delta: int) -> None:
    total = totals.get(tenant, 0) + delta
    if total:
        totals[tenant] = total
    else:
        totals.pop(tenant, None)  # no tenant id left behind once its KV is gone


def split_bytes(nbytes: int, n_blocks: int) -> list[int]:
    """`nbytes` spread over `n_blocks` blocks, summing exactly to `nbytes`."""
    return [nbytes * (i + 1) // n_blocks - nbytes * i // n_blocks for i in range(n_blocks)]


def _discard(index: dict[_K, set[str]], key: _K, h: str) -> None:
    holders = index.get(key)
    if holders is not None:
        holders.discard(h)
        if not holders:
            del index[key]
