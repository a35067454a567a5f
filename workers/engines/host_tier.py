"""The host-memory KV tier: blocks evicted from the device budget kept as tensors in this
process's RAM, read back on a hit when that beats recomputing them.

On a GPU this is the tier vLLM's offloading connectors and LMCache put first: host RAM is
an order of magnitude larger than the KV budget on the card and a copy back is far cheaper
than a prefill. On a CPU the device budget is host RAM too; the tier is then a second
budget, spilled to without a copy. Nothing here survives a restart (the disk tier does).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from workers.engines.kv_tier import KVTier, Layout
from workers.kv.tier_index import TierBlock


class HostTier(KVTier):
    """Spilled blocks as host tensors, by chain hash."""

    kind = "host"

    def __init__(self, max_bytes: int, layout: Layout, device: str) -> None:
        super().__init__(max_bytes, layout, device)
        self._held: dict[str, torch.Tensor] = {}

    def _write(self, block: TierBlock, data: torch.Tensor) -> None:
        # Blocks are never written in place, so a CPU block's tensor is kept as it is (the
        # device cache dropping it frees nothing twice); a GPU block is copied out.
        self._held[block.block_hash] = data.detach().to("cpu")

    def _unlink(self, hashes: Iterable[str]) -> None:
        for h in hashes:
            self._held.pop(h, None)

    def _read(self, block_hash: str) -> torch.Tensor | None:
        data = self._held.get(block_hash)
        return None if data is None else data.to(self.device)
