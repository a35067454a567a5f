"""`tiered`: hybrid warmup over a worker that keeps the disk KV tier below device memory
(seed 000's tiered KV cache), the product's tier (`workers.engines.disk_tier`) as deployed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ragwarm.bench.strategies.streams_policy import Hybrid
from workers.engines.disk_tier import DiskTier
from workers.engines.tiers import open_tier
from workers.settings import WorkerSettings


class TieredHybrid(Hybrid):
    """`tiered`: `hybrid` (the streams app with every input, over request caching) on a
    worker with a disk tier. Hybrid, not request caching alone: the tier changes where KV
    lives, not what is warmed, so the comparison with `hybrid` isolates what the tier adds
    (spilled blocks read back instead of recomputed, warm prefixes that survive a restart);
    the seed's tiered row is a memory layout too, and needs a warmup beside it."""

    name: ClassVar[str] = "tiered"
    disk_tier: ClassVar[bool] = True


def open_sim_tier(model: Any, settings: WorkerSettings, root: Path, max_bytes: int) -> DiskTier:
    """The disk tier of one simulated worker, opened (and its files scanned) as a worker
    boots: `root` is that worker's own directory, kept across its restarts."""
    tier_settings = settings.model_copy(update={
        "disk_tier": True, "disk_tier_path": root, "disk_tier_bytes": max_bytes,
    })
    tier = open_tier(model, tier_settings, None)
    assert isinstance(tier, DiskTier)  # disk_tier is on
    return tier
