"""The per-tenant quota on warmup-held KV (issue 41): one tenant's pins and TTL leases cannot
take the budget every tenant shares. Pure bookkeeping over the block pool's per-tenant totals
(a block belongs to one tenant: chains are salted by tenant)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workers.kv.block_pool import BlockPool
from workers.kv.entries import WarmupRefused
from workers.kv.memory import Budget


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
