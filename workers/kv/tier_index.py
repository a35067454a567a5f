"""Pure bookkeeping of the disk KV tier: which blocks it holds, their chunk marks, its budget.

Blocks are addressed by chain hash, like the device pool (`workers.kv.block_pool`), and know
their parent (the block before them in the chain): a block is only reachable through its
parent, so removing one removes its whole subtree. Least recently used goes first, leaves
before the blocks they extend. The file I/O lives in `workers.engines.disk_tier`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from workers.kv.block_pool import ChunkKey


@dataclass(frozen=True)
class TierBlock:
    """One block on disk: its chain place, its tenant, its size and the chunks it passes."""

    block_hash: str
    parent: str | None
    tenant: str
    nbytes: int
    marks: frozenset[ChunkKey] = frozenset()
    end: bool = False  # a cached prefix ended here (a restart restores it as an entry)
    approx: bool = False  # a blend's KV (`Block.approx`): restored, it is marked again


@dataclass(frozen=True)
class TierStats:
    blocks: int
    bytes: int
    max_bytes: int
    chains: int


class TierIndex:
    """Blocks on disk by chain hash, with parent links, chunk marks, LRU order and a budget."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes_used = 0
        self._blocks: dict[str, TierBlock] = {}
        # Children by parent hash, kept even while the parent is not here (it may be on the
        # device only): cutting that parent must still reach them.
        self._children: dict[str, set[str]] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._by_chunk: dict[ChunkKey, set[str]] = {}
        self._by_chunk_id: dict[str, set[str]] = {}
        self.version = 0  # bumped on every add and removal, for callers caching views

    # -- read side -------------------------------------------------------------------

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, block_hash: str) -> TierBlock | None:
        return self._blocks.get(block_hash)

    def run(self, hashes: Sequence[str], start: int = 0) -> int:
        """How many of `hashes[start:]` are here in a row."""
        n = 0
        for h in hashes[start:]:
            if h not in self._blocks:
                break
            n += 1
        return n

    def chain_ends(self) -> list[str]:
        """Hashes of the blocks no block here extends: the longest prefixes held."""
        return [h for h in self._blocks if not self._children.get(h, set()) & self._blocks.keys()]

    def prefix_ends(self) -> list[str]:
        """Where the prefixes held end: the chain ends, and blocks a shorter cached prefix
        ended at (a warm prefix that a longer prompt extends)."""
        ends = set(self.chain_ends())
        return [h for h, b in self._blocks.items() if b.end or h in ends]

    def chain(self, end: str) -> list[str] | None:
        """The hashes from the root to `end`; None when a block on the way is not here (the
        chain cannot be read back without it)."""
        chain: list[str] = []
        h: str | None = end
        while h is not None:
            block = self._blocks.get(h)
            if block is None:
                return None
            chain.append(h)
            h = block.parent
        return chain[::-1]

    def restore_plan(self, max_bytes: int) -> list[list[str]]:
        """The whole chains to read back into an empty device, most recently used first,
        within `max_bytes` (a block two chains share counts once): what a restarted worker
        serves warm at once. Chains that do not fit are passed over for shorter ones."""
        order = {h: n for n, h in enumerate(self._lru)}  # later: used more recently
        ends = sorted(self.prefix_ends(), key=order.__getitem__, reverse=True)
        plan: list[list[str]] = []
        chosen: set[str] = set()
        used = 0
        for end in ends:
            chain = self.chain(end)
            if chain is None:
                continue
            new = [h for h in chain if h not in chosen]
            cost = sum(self._blocks[h].nbytes for h in new)
            if used + cost > max_bytes:
                continue
            plan.append(chain)
            chosen.update(new)
            used += cost
        return plan

    def stats(self) -> TierStats:
        return TierStats(len(self._blocks), self.bytes_used, self.max_bytes, len(self.chain_ends()))

    # -- write side ------------------------------------------------------------------

    def admissible(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes

    def add(self, block: TierBlock) -> list[str]:
        """Hold `block` (merging marks when it is here); returns the hashes evicted for room.

        Raises ValueError when the block alone is over the budget.
        """
        if not self.admissible(block.nbytes):
            raise ValueError(f"block of {block.nbytes} bytes exceeds max_bytes={self.max_bytes}")
        if block.block_hash in self._blocks:
            self.narrow(block.block_hash, block.marks)
            self.mark_end(block.block_hash, block.end)
            self._lru.move_to_end(block.block_hash)
            return []
        evicted = self._make_room(block.nbytes, keep=block.parent)
        self._blocks[block.block_hash] = block
        self.bytes_used += block.nbytes
        self.version += 1
        self._lru[block.block_hash] = None
        if block.parent is not None:
            self._children.setdefault(block.parent, set()).add(block.block_hash)
        self._index_marks(block.block_hash, block.marks)
        return evicted

    def narrow(self, block_hash: str, marks: Iterable[ChunkKey]) -> bool:
        """Keep only the marks of a held block that `marks` also has; whether any went (its
        file needs rewriting). Every estimate of a block's chunks errs on the side of too
        many, so two estimates together are at least as right as either."""
        block = self._blocks[block_hash]
        gone = block.marks - frozenset(marks)
        if not gone:
            return False
        self._blocks[block_hash] = replace(block, marks=block.marks - gone)
        for ref in gone:
            _discard(self._by_chunk, ref, block_hash)
            _discard(self._by_chunk_id, ref[0], block_hash)
        return True

    def mark_end(self, block_hash: str, end: bool) -> bool:
        """Record that a cached prefix ends at a held block; whether that is news."""
        block = self._blocks[block_hash]
        if not end or block.end:
            return False
        self._blocks[block_hash] = replace(block, end=True)
        self.version += 1
        return True

    def mark_exact(self, block_hash: str) -> bool:
        """Record that a held block's KV is now exact (the device recomputed it); whether
        that is news."""
        block = self._blocks[block_hash]
        if not block.approx:
            return False
        self._blocks[block_hash] = replace(block, approx=False)
        self.version += 1
        return True

    def touch(self, chain: Sequence[str]) -> None:
        """`chain` was used: most recent, its head after its tail so leaves go first."""
        for h in reversed(chain):
            if h in self._lru:
                self._lru.move_to_end(h)

    def remove(self, hashes: Iterable[str]) -> list[str]:
        """Remove `hashes` (held here or not) and every block extending them; the removed."""
        removed: list[str] = []
        stack = list(hashes)
        while stack:
            h = stack.pop()
            stack.extend(self._children.pop(h, ()))
            block = self._blocks.pop(h, None)
            if block is None:
                continue
            removed.append(h)
            self.version += 1
            self.bytes_used -= block.nbytes
            del self._lru[h]
            if block.parent is not None and block.parent in self._children:
                self._children[block.parent].discard(h)
                if not self._children[block.parent]:
                    del self._children[block.parent]
            for ref in block.marks:
                _discard(self._by_chunk, ref, h)
                _discard(self._by_chunk_id, ref[0], h)
        return removed

    def invalidate(
        self, refs: Iterable[ChunkKey] = (), chunk_ids: Iterable[str] = (),
        tenant: str | None = None,
    ) -> list[str]:
        """Remove every block marked with one of `refs` or `chunk_ids`, of `tenant` only when
        given (another tenant's identical chunk is not its KB), and what extends it; a block
        that another chunk's chains fork from stays (`_past_fork`)."""
        refs, chunk_ids = set(refs), set(chunk_ids)
        hit: set[str] = set()
        for ref in refs:
            hit |= self._by_chunk.get(ref, set())
        for chunk_id in chunk_ids:
            hit |= self._by_chunk_id.get(chunk_id, set())
        hit = self._past_fork(hit, lambda r: r in refs or r[0] in chunk_ids)
        if tenant is not None:
            hit = {h for h in hit if self._blocks[h].tenant == tenant}
        return self.remove(sorted(hit))

    def _past_fork(self, marked: set[str], changed: Callable[[ChunkKey], bool]) -> set[str]:
        """The `marked` blocks no chain forks from into blocks the change does not mark: a
        block holding a chunk's first tokens is shared with prompts whose chunk there opens
        the same way, and its KV is theirs too (as `workers.kv.entries.doomed_blocks`; a
        child without marks is no proof of a fork)."""
        def forks(h: str) -> bool:
            marks = (self._blocks[c].marks for c in self._children.get(h, ()) if c in self._blocks)
            return any(m and not any(map(changed, m)) for m in marks)

        return {h for h in marked if not forks(h)}

    def _make_room(self, nbytes: int, keep: str | None) -> list[str]:
        evicted: list[str] = []
        while self.bytes_used + nbytes > self.max_bytes:
            # The new block's parent goes last: without it the block is unreachable.
            oldest = next((h for h in self._lru if h != keep), next(iter(self._lru), None))
            if oldest is None:
                break
            evicted += self.remove([self._leaf_under(oldest, keep)])
        return evicted

    def _leaf_under(self, h: str, keep: str | None) -> str:
        """A block extending `h` that nothing here extends (blocks are only reachable through
        their parents, so a leaf goes before the blocks it needs)."""
        while True:
            below = sorted(self._children.get(h, set()) & self._blocks.keys() - {keep})
            if not below:
                return h
            h = below[0]

    def _index_marks(self, block_hash: str, marks: Iterable[ChunkKey]) -> None:
        for ref in marks:
            self._by_chunk.setdefault(ref, set()).add(block_hash)
            self._by_chunk_id.setdefault(ref[0], set()).add(block_hash)


@dataclass
class RestoreCosts:
    """Running estimates of reading a byte from the tier and computing a prompt token, so a
    hit is restored only when that is cheaper than recomputing it (unknown: restore)."""

    read_s_per_byte: float | None = None
    compute_s_per_token: float | None = None
    weight: float = 0.3  # of the newest sample in the moving average

    def worth_restoring(self, n_tokens: int, nbytes: int) -> bool:
        if self.read_s_per_byte is None or self.compute_s_per_token is None:
            return True
        return nbytes * self.read_s_per_byte < n_tokens * self.compute_s_per_token

    def saw_read(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0:
            self.read_s_per_byte = self._mix(self.read_s_per_byte, seconds / nbytes)

    def saw_compute(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0:
            self.compute_s_per_token = self._mix(self.compute_s_per_token, seconds / n_tokens)

    def _mix(self, old: float | None, sample: float) -> float:
        return sample if old is None else (1 - self.weight) * old + self.weight * sample


def _discard(index: dict, key: object, h: str) -> None:
    holders = index.get(key)
    if holders is not None:
        holders.discard(h)
        if not holders:
            del index[key]
