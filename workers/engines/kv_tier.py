"""A KV tier below the device budget: what it holds and what it writes, drops and reads,
over a storage that subclasses give (`DiskTier`: one file per block; `HostTier`: tensors in
host memory). Bookkeeping (which blocks, their chunk marks, the budget, use order, restore
costs) is `workers.kv.tier_index`; this module only moves tensors."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from workers.kv.tier_index import RestoreCosts, TierBlock, TierIndex
from workers.kv.tier_journal import TierOps


@dataclass(frozen=True)
class Layout:
    """What every block of this engine looks like; blocks of another layout are not ours."""

    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]

    @property
    def nbytes(self) -> int:
        n = torch.tensor([], dtype=self.torch_dtype).element_size()
        for d in self.shape:
            n *= d
        return n


class KVTier(ABC):
    """Blocks spilled below the device budget, with their index, budget and restore costs.

    Subclasses store the tensors: `_write` one block (dropping it from the index when that
    fails: the tier is a cache, a request must never fail for it), `_unlink` some, `_read`
    one back (None when it cannot), and `_used` remembers a use order that outlives them.
    """

    kind = "tier"

    def __init__(self, max_bytes: int, layout: Layout, device: str) -> None:
        self.layout = layout
        self.device = device
        self.index = TierIndex(max_bytes)
        self.costs = RestoreCosts()

    def scan(self) -> int:
        """Rebuild the index from what survived a restart; returns the blocks found."""
        return 0

    # -- writes and drops ------------------------------------------------------------

    def apply(self, ops: TierOps, tensors: dict[str, torch.Tensor]) -> list[str]:
        """Write the blocks `ops` names whose tensors are given, then drop what it says is
        stale; returns the hashes dropped. A spilled block already here is left as it is: an
        evicted request entry's refs say nothing about the chunks it does not list."""
        for h, block in ops.writes.items():
            data = tensors.get(h)
            if data is not None:
                self.put(block, data)
        for h, block in ops.spills.items():
            data = tensors.get(h)
            if data is not None and h not in self.index:
                self.put(block, data)
        removed = self.index.remove(ops.cut)
        removed += self.index.invalidate(chunk_ids=ops.chunk_ids)
        for tenant in sorted({t for t, _ in ops.refs}, key=str):  # one tenant's edit at a time
            removed += self.index.invalidate([r for t, r in ops.refs if t == tenant], tenant=tenant)
        self._unlink(removed)
        return removed

    def put(self, block: TierBlock, data: torch.Tensor) -> None:
        """Hold `block` here (a held one keeps only the marks both have)."""
        index = self.index
        if block.block_hash in index:
            narrowed = index.narrow(block.block_hash, block.marks)
            if index.mark_end(block.block_hash, block.end) or narrowed:  # its header changed
                self._write(index.get(block.block_hash) or block, data)
            index.touch([block.block_hash])
            return
        if not index.admissible(block.nbytes):
            return
        self._unlink(index.add(block))
        self._write(block, data)

    # -- reads -----------------------------------------------------------------------

    def load(self, hashes: Sequence[str]) -> list[torch.Tensor]:
        """The tensors of the leading `hashes` that read back whole (on the engine's
        device); a block that does not is dropped with everything extending it."""
        start = time.perf_counter()
        out: list[torch.Tensor] = []
        for h in hashes:
            data = self._read(h)
            if data is None or tuple(data.shape) != self.layout.shape or (
                data.dtype != self.layout.torch_dtype
            ):
                self._unlink(self.index.remove([h]))
                break
            out.append(data)
        self.index.touch(hashes[: len(out)])
        self._used(hashes[: len(out)])
        self.costs.saw_read(sum(d.nbytes for d in out), time.perf_counter() - start)
        return out

    # -- storage ---------------------------------------------------------------------

    @abstractmethod
    def _write(self, block: TierBlock, data: torch.Tensor) -> None:
        """Given by the storage."""

    @abstractmethod
    def _unlink(self, hashes: Iterable[str]) -> None:
        """Given by the storage."""

    @abstractmethod
    def _read(self, block_hash: str) -> torch.Tensor | None:
        """Given by the storage."""

    def _used(self, hashes: Sequence[str]) -> None:
        """Remember a use order beyond the index (a file's mtime); nothing by default."""
        return None
