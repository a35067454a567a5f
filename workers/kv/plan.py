"""What an engine does to its KV after the KV manager changed: one value, `KVPlan`.

`PrefixCache` decides (admit, evict, invalidate, spill, expire) and only keeps books; the
engine holds the KV (tensors, or a server's slots) and carries out the plan it takes from
the cache with `PrefixCache.take_plan` (`PrefixEngine.sync`). A load is not a plan: a block
is read back from the tier only on the lookup that wants it, in one shared sequence
(`PrefixEngine._restore`: how many blocks, the engine's read, the cache's readmission, the
engine's hold), whose readmission may itself make a plan (the blocks it evicted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.kv.tier_journal import TierOps


@dataclass(frozen=True)
class KVPlan:
    """In this order: `store` (writes and spills to the tier below device memory, and what
    leaves it; the tensors are still here), then `free` (blocks whose KV leaves the device,
    none of them back in the pool since) and `gone` (prefixes the cache no longer holds, for
    engines that keep state per prefix: a server's entry sizes and slots)."""

    store: TierOps = field(default_factory=TierOps)
    free: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.store or self.free or self.gone)
