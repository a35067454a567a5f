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
from workers.kv.tier_journal import TierOps, absorb


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
    # Whether it survives a restart: then warm prefixes are written through as they are
    # placed, not only when evicted (`TierJournal.write_through`).
    durable = False

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
        stale (`workers.kv.tier_journal.absorb` keeps the book); returns the hashes dropped."""
        changes = absorb(self.index, ops, tensors)
        self._unlink(changes.unlink)
        for h in changes.write:
            block = self.index.get(h)
            if block is not None:
                self._write(block, tensors[h])
        return changes.dropped

    def put(self, block: TierBlock, data: torch.Tensor) -> None:
        """Hold `block` here (a held one keeps only the marks both have)."""
        self.apply(TierOps(writes={block.block_hash: block}), {block.block_hash: data})

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
