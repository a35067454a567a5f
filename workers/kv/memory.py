"""How much KV a worker may hold: the seed's memory tiers, one cache's budget (all bytes,
entries, bytes pinned by warmup) and each tenant's quota within it (issue 41: one tenant's
pins and TTL leases cannot take the budget every tenant shares)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.events import MEMORY_THRESHOLD
from workers.kv.block_pool import BlockPool
from workers.kv.entries import WarmupRefused

GiB = 1024**3

# Seed memory tiers: "<4 GB warmup disabled, max batch 2; 4–16 GB ≤30% for warmup,
# batch 4–8; >16 GB ≤50%, batch 12+". GB is read as GiB, as accelerators report it.
SMALL_TIER_MAX_BYTES = 4 * GiB
MEDIUM_TIER_MAX_BYTES = 16 * GiB
SMALL_WARM_SHARE = 0.0
MEDIUM_WARM_SHARE = 0.30
LARGE_WARM_SHARE = 0.50
# Seed: "keep a 10% burst buffer" free of any KV, warm or not.
BURST_BUFFER_SHARE = 0.10
DEFAULT_MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Budget:
    """Bounds of one cache: all bytes, entry count, and bytes pinned by warmup."""

    max_bytes: int
    max_entries: int
    warm_bytes: int

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_entries", "warm_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"Budget.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class MemoryTier:
    """A seed memory tier: its name, the warmup share and the suggested max batch."""

    name: str
    warm_share: float
    max_batch: int


SMALL = MemoryTier("small", SMALL_WARM_SHARE, 2)
MEDIUM = MemoryTier("medium", MEDIUM_WARM_SHARE, 8)
LARGE = MemoryTier("large", LARGE_WARM_SHARE, 12)


def memory_tier(total_bytes: int) -> MemoryTier:
    """The seed tier of an accelerator with `total_bytes` of memory."""
    if total_bytes < SMALL_TIER_MAX_BYTES:
        return SMALL
    if total_bytes <= MEDIUM_TIER_MAX_BYTES:
        return MEDIUM
    return LARGE


def warm_share(total_bytes: int) -> float:
    """Largest share of total memory that warmup may pin (0 disables warmup)."""
    return memory_tier(total_bytes).warm_share


def plan_budget(
    total_memory_bytes: int, kv_bytes_cap: int, *, max_entries: int = DEFAULT_MAX_ENTRIES
) -> Budget:
    """A cache budget: KV within its cap and 90% of total; pins within the tier's share."""
    if total_memory_bytes < 0 or kv_bytes_cap < 0:
        raise ValueError("memory figures must be >= 0")
    burst_cap = int(total_memory_bytes * (1.0 - BURST_BUFFER_SHARE))
    max_bytes = min(kv_bytes_cap, burst_cap)
    warm_bytes = min(int(total_memory_bytes * warm_share(total_memory_bytes)), max_bytes)
    return Budget(max_bytes=max_bytes, max_entries=max_entries, warm_bytes=warm_bytes)


def accepts_warmup(used_bytes: int, total_bytes: int, threshold: float = MEMORY_THRESHOLD) -> bool:
    """Whether a worker at this memory use may take new warmup (at or under the threshold)."""
    if total_bytes <= 0:
        return False
    return used_bytes / total_bytes <= threshold


# -- each tenant's quota --------------------------------------------------------------------
# Pure bookkeeping over the block pool's per-tenant totals (a block belongs to one tenant:
# chains are salted by tenant).


def tenant_quota(budget_bytes: int, share: float) -> int:
    """Bytes of a budget shared by every tenant that one tenant may hold (issue 41): `share`
    of it, so one tenant's pins and leases cannot take what the others warm. 1.0: no quota."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"a tenant's share must be in (0, 1], got {share}")
    return int(budget_bytes * share)


def quota_refusal(
    held: Mapping[str, int], tenant: str, adding: int, quota: int, what: str
) -> str | None:
    """Why admitting `adding` more bytes of `what` for `tenant` is refused, given what each
    tenant holds (`held`); None when the tenant stays within `quota`."""
    after = held.get(tenant, 0) + adding
    if adding > 0 and after > quota:
        return f"tenant {tenant!r} would hold {after} bytes of {what}, over its quota of {quota}"
    return None


def capped(ttl_s: float | None, max_ttl_s: float | None) -> float | None:
    """A lease asked for, cut to the longest one the worker grants (None: no cap, or none
    asked: the cache's default TTL, which must itself be within the cap)."""
    if ttl_s is None or max_ttl_s is None:
        return ttl_s
    return min(ttl_s, max_ttl_s)


def quota_check(
    pool: BlockPool, budget: Budget, share: float, tenant: str, chain: Sequence[str],
    sizes: Sequence[int], pinned: bool, managed: bool,
) -> None:
    """Raise `WarmupRefused` unless `tenant`, holding `chain` as asked, keeps its pinned bytes
    within its share of `warm_bytes` and its managed (pinned or TTL-held) bytes within its
    share of `max_bytes` (`share` of each; 1.0 checks nothing)."""
    if share >= 1.0:
        return
    why = None
    if pinned:
        why = quota_refusal(pool.pinned_by_tenant, tenant, pool.unpinned_bytes(chain, sizes),
                            tenant_quota(budget.warm_bytes, share), "pinned KV")
    if why is None and managed:
        why = quota_refusal(pool.managed_by_tenant, tenant, pool.unmanaged_bytes(chain, sizes),
                            tenant_quota(budget.max_bytes, share), "pinned or TTL-held KV")
    if why is not None:
        raise WarmupRefused(why)
