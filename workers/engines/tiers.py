"""Which KV tier a torch engine keeps below its device budget, opened from the settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.engines.disk_tier import DiskTier
from workers.engines.host_tier import HostTier
from workers.engines.kv_blocks import resolve_kv_dtype
from workers.engines.kv_tier import KVTier, Layout
from workers.kv.sizing import kv_dims
from workers.settings import WorkerSettings


def open_tier(model: Any, settings: WorkerSettings, default_path: Path | None) -> KVTier | None:
    """The KV tier the settings ask for, in this model's block layout: on disk (its index
    rebuilt from the files), in host memory, or None."""
    if not settings.disk_tier and settings.host_tier_size == 0:
        return None
    layers, kv_heads, head_dim = kv_dims(model.config)
    dtype = str(resolve_kv_dtype(settings.kv_dtype, model.dtype)).removeprefix("torch.")
    layout = Layout(dtype, (2 * layers, kv_heads, settings.block_size, head_dim))
    device = str(next(model.parameters()).device)
    tier: KVTier
    if settings.disk_tier:
        root = settings.disk_tier_path or default_path
        if root is None:
            raise ValueError("the disk tier needs a directory: set RAGWARM_WORKER_DISK_TIER_PATH")
        tier = DiskTier(root, settings.disk_tier_bytes, layout, device)
    else:
        tier = HostTier(settings.host_tier_size, layout, device)
    tier.scan()
    return tier
