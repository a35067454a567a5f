"""How big a model's KV is and the cache a worker builds from its settings (pure, no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.kv.cache import PrefixCache
from workers.kv.memory import LARGE_WARM_SHARE, Budget, plan_budget
from workers.kv.request_blocks import make_prefix_cache
from workers.settings import WorkerSettings

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _field(cfg: Any, name: str) -> Any:
    return cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)


def text_config(config: Any) -> Any:
    """The decoder's config: `text_config` of a multimodal config, else the config itself."""
    if isinstance(config, Mapping):
        return config.get("text_config", config)
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter else config


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Keys and values of one token over every layer, for an HF config (dict or object)."""
    layers, kv_heads, head_dim = kv_dims(config)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_dims(config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of an HF config (dict or object)."""
    cfg = text_config(config)
    heads = _field(cfg, "num_attention_heads")
    kv_heads = _field(cfg, "num_key_value_heads") or heads
    head_dim = _field(cfg, "head_dim") or _field(cfg, "hidden_size") // heads
    return int(_field(cfg, "num_hidden_layers")), int(kv_heads), int(head_dim)


def cache_for(
    settings: WorkerSettings, total_memory: int | None, kv_cap: int | None = None
) -> PrefixCache:
    """The worker's cache: KV within `kv_cap` (default the settings' cap) and the seed's
    memory tiers of `total_memory`; with the memory unknown (a remote server), the cap is
    all KV and warmup may pin the large tier's share of it."""
    cap = settings.kv_bytes if kv_cap is None else kv_cap
    if total_memory is None:
        budget = Budget(cap, settings.max_entries, int(cap * LARGE_WARM_SHARE))
    else:
        budget = plan_budget(total_memory, cap, max_entries=settings.max_entries)
    return make_prefix_cache(
        settings.request_caching,
        budget,
        policy=settings.eviction_policy,
        default_ttl_s=settings.ttl_s,
        block_size=settings.block_size,
        tenant_share=settings.tenant_share,
        max_ttl_s=settings.max_ttl_s,
    )
