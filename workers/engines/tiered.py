"""The torch engine's side of its KV tier (host memory or disk): spill and drop after cache
changes, read blocks back for a restore (`PrefixEngine._restore` keeps its books), and what
the tier holds for status events (`workers.engines.kv_tier` and its storages move the
tensors)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import torch

from workers.engines.kv_blocks import BlockKV, as_block
from workers.engines.kv_tier import KVTier
from workers.kv.cache import PrefixCache, WarmupRefused
from workers.kv.tier_index import TierIndex
from workers.kv.tier_journal import TierOps


class Tiered:
    """Mixed into an engine keeping block tensors in `_blocks` over `cache`."""

    tier: KVTier | None
    cache: PrefixCache
    block_size: int
    _blocks: dict[str, BlockKV]
    _tier_view: tuple[int, list[str]] = (-1, [])

    block_bytes: Any  # a property of the engine
    sync: Any  # the engine's sync
    _restore: Any  # `PrefixEngine._restore`, over the three below

    def tier_state(self) -> tuple[list[str], int]:
        """Ends of the chains the tier holds (on disk: what a restarted worker still serves) and
        its bytes; recomputed only when the tier changed."""
        if self.tier is None:
            return [], 0
        index = self.tier.index
        if self._tier_view[0] != index.version:
            self._tier_view = (index.version, index.prefix_ends())
        return list(self._tier_view[1]), index.bytes_used

    def tier_total(self) -> int:
        return 0 if self.tier is None else self.tier.index.max_bytes

    def _store(self, ops: TierOps) -> None:
        """Write what a plan stores (tensors still here) and drop what it cut; called by
        `apply` before it drops the tensors of freed blocks."""
        if self.tier is not None and ops:
            queued = [*ops.writes, *ops.spills]
            tensors = {h: self._blocks[h].data for h in queued if h in self._blocks}
            self.tier.apply(ops, tensors)

    def restorable(self, hashes: list[str], have: int) -> int:
        """How many blocks after the first `have` of `hashes` a hit would read back from the
        tier: those held there in a row, none when recomputing them is cheaper."""
        tier = self.tier
        if tier is None:
            return 0
        n = tier.index.run(hashes, have)
        if n == 0 or not tier.costs.worth_restoring(n * self.block_size, n * self.block_bytes):
            return 0
        return n

    def restore_tier(self, max_bytes: int) -> int:
        """Read back what the tier holds, most recently used first, within `max_bytes` of
        device memory, so a restarted worker serves its prefixes warm at once instead of
        waiting for a re-warm (issue 40); returns the chains restored. Call it after the
        invalidations sent while it was down have run."""
        tier = self.tier
        if tier is None:
            return 0
        restored = 0
        for chain in tier.index.restore_plan(max_bytes):
            end = tier.index.get(chain[-1])
            if end is None:  # a read that failed dropped it, and what extends it
                continue
            have = next((i for i, h in enumerate(chain) if h not in self._blocks), len(chain))
            if have < len(chain):
                restored += self._restore(chain, have, end.tenant) == len(chain)
                continue
            try:  # its blocks came back with a longer prefix: it is an entry of its own
                self.cache.admit(tenant=end.tenant, hashes=chain,
                                 nbytes=len(chain) * self.block_bytes, kind="request")
                restored += 1
            except WarmupRefused:
                pass
        self.sync()
        return restored

    def _tier_index(self) -> TierIndex | None:
        return None if self.tier is None else self.tier.index

    def _load(self, hashes: list[str]) -> list[torch.Tensor]:
        return [] if self.tier is None else self.tier.load(hashes)

    def _place(self, hashes: Sequence[str], loaded: Sequence[object]) -> None:
        for h, data in zip(hashes, loaded, strict=True):
            self._blocks.setdefault(h, as_block(cast(torch.Tensor, data)))

    def _saw_compute(self, n_tokens: int, start: float) -> None:
        if self.tier is not None and n_tokens >= self.block_size:
            self.tier.costs.saw_compute(n_tokens, time.perf_counter() - start)
