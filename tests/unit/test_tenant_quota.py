"""The per-tenant quota on pinned and TTL-held KV, and /v1/prefill held to the limits of a
command: the warm threshold and the longest lease (issue 41, item 6)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.cache_kit import chain, make_cache
from workers.kv.cache import WarmupRefused
from workers.kv.memory import capped, quota_refusal, tenant_quota
from workers.kv.sizing import cache_for
from workers.service import STATE
from workers.settings import WorkerSettings

DAY = 86400.0


def test_one_tenant_cannot_pin_the_whole_budget() -> None:
    # 100 bytes a block; warm_bytes 500: each of two tenants may pin 250.
    cache, _ = make_cache(max_bytes=2000, max_entries=20, warm_bytes=500, tenant_share=0.5)
    cache.admit(tenant="a", hashes=chain(1, 2, tenant="a"), nbytes=200, pin=True)
    with pytest.raises(WarmupRefused, match="tenant 'a' would hold 300 bytes of pinned KV"):
        cache.admit(tenant="a", hashes=chain(3, tenant="a"), nbytes=100, pin=True)
    # The rest of the pinned budget is still there for another tenant.
    cache.admit(tenant="b", hashes=chain(1, 2, tenant="b"), nbytes=200, pin=True)
    assert cache.pool.pinned_by_tenant == {"a": 200, "b": 200}


def test_ttl_held_kv_is_within_the_tenants_share_of_the_cache() -> None:
    cache, _ = make_cache(max_bytes=1000, max_entries=20, warm_bytes=500, tenant_share=0.25)
    cache.admit(tenant="a", hashes=chain(1, 2, tenant="a"), nbytes=200, ttl_s=60)
    with pytest.raises(WarmupRefused, match="TTL-held"):
        cache.admit(tenant="a", hashes=chain(1, 2, 3, tenant="a"), nbytes=300, ttl_s=60)
    # A request's own prompt is not warmup's: it may go on being cached, evictable.
    cache.admit(tenant="a", hashes=chain(1, 2, 3, tenant="a"), nbytes=300, kind="request")
    # ... but a lease on it is held to the quota too.
    with pytest.raises(WarmupRefused):
        cache.extend_ttl(chain(1, 2, 3, tenant="a")[-1], 60)


def test_a_lease_is_cut_to_the_longest_the_worker_grants() -> None:
    cache, clock = make_cache(max_ttl_s=DAY)
    entry, _ = cache.admit(tenant="a", hashes=chain(1, tenant="a"), nbytes=100, pin=True,
                           ttl_s=30 * DAY)  # fmt: skip
    assert entry.expires_at == clock.t + DAY
    cache.extend_ttl(entry.prefix_hash, 30 * DAY)
    assert cache.get(entry.prefix_hash).expires_at == clock.t + DAY


def test_the_worker_settings_reach_the_cache() -> None:
    cache = cache_for(WorkerSettings(kv_bytes=10**6, tenant_share=0.3, max_ttl_s=600), None)
    assert (cache.tenant_share, cache.max_ttl_s) == (0.3, 600)
    with pytest.raises(ValueError):
        WorkerSettings(tenant_share=0)


def test_quota_arithmetic() -> None:
    assert tenant_quota(1000, 0.25) == 250 and tenant_quota(1000, 1.0) == 1000
    with pytest.raises(ValueError):
        tenant_quota(1000, 1.5)
    assert quota_refusal({"a": 200}, "a", 50, 250, "x") is None
    assert quota_refusal({"a": 200}, "a", 51, 250, "x") is not None
    assert quota_refusal({"a": 900}, "a", 0, 250, "x") is None  # nothing new: a refresh
    assert capped(None, DAY) is None and capped(5.0, None) == 5.0 and capped(2 * DAY, DAY) == DAY


admits = st.lists(
    st.tuples(st.sampled_from("abc"), st.lists(st.integers(0, 6), min_size=1, max_size=4),
              st.booleans(), st.sampled_from([None, 30.0, 3600.0]),
              st.sampled_from(["managed", "request", "extend", "release"])),
    max_size=40,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(ops=admits, share=st.sampled_from([0.2, 0.34, 0.5, 1.0]))
def test_no_tenant_ever_holds_more_than_its_quota(ops, share: float) -> None:
    cache, clock = make_cache(max_bytes=1500, max_entries=12, warm_bytes=700, tenant_share=share)
    for tenant, blocks, pin, ttl, kind in ops:
        clock.t += 7
        hashes = chain(*blocks, tenant=tenant)
        try:
            if kind == "extend":
                cache.extend_ttl(hashes[-1], 60)
            elif kind == "release":
                cache.release(hashes[-1])
            else:
                cache.admit(tenant=tenant, hashes=hashes, nbytes=100 * len(hashes),
                            pin=pin and kind == "managed", ttl_s=ttl, kind=kind)  # fmt: skip
        except WarmupRefused:
            pass
        pool = cache.pool
        for held, quota in ((pool.pinned_by_tenant, tenant_quota(700, share)),
                            (pool.managed_by_tenant, tenant_quota(1500, share))):  # fmt: skip
            assert all(v <= quota for v in held.values()), held
        # The per-tenant totals are the global ones, split.
        assert sum(pool.pinned_by_tenant.values()) == pool.pinned_bytes
        assert sum(pool.managed_by_tenant.values()) == pool.managed_bytes


# --- POST /v1/prefill ------------------------------------------------------------------------


async def test_the_api_refuses_a_prefill_over_the_warm_threshold_like_a_command(booted) -> None:  # noqa: F811
    client, _ = booted
    runtime = client.app[STATE].live_runtime()
    first = await client.post("/v1/prefill", json={"token_ids": list(range(10)), "pin": True})
    assert first.status == 200, await first.text()
    runtime.warmup_threshold = 1e-9  # any pinned byte is over it now
    second = await client.post("/v1/prefill", json={"token_ids": list(range(20, 30))})
    assert second.status == 409
    assert "pinned memory" in (await second.json())["error"]["message"]


async def test_the_api_lease_is_cut_to_the_workers_longest(booted) -> None:  # noqa: F811
    client, _ = booted
    runtime = client.app[STATE].live_runtime()
    runtime.engine.cache.max_ttl_s = DAY
    body = {"token_ids": list(range(10)), "pin": True, "ttl_s": 30 * DAY}
    stored = await (await client.post("/v1/prefill", json=body)).json()
    entry = runtime.engine.cache.get(stored["prefix_hash"])
    assert entry is not None and entry.expires_at is not None
    # Cut to exactly the cap (approx: the two clock floats differ in their last bit).
    assert entry.expires_at - entry.created_at == pytest.approx(DAY)
