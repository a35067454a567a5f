"""Tenant-bound keys: a key grants one tenant (or all); the worker API enforces it."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from schemas.auth import Forbidden, Grant, KeyRing
from tests.unit.worker_fakes import GatedLifecycle, wait_ready
from workers.service import ServiceConfig, ServiceState, build_app

RING = KeyRing("op-key", {"acme": "acme-key", "globex": "globex-key", "*": "ops2"})


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_each_key_grants_its_tenant_and_operators_grant_all() -> None:
    assert RING.grant("Bearer acme-key") == Grant("acme")
    assert RING.grant("bearer  globex-key ") == Grant("globex")
    assert RING.grant("Bearer op-key") == Grant(None) == RING.grant("Bearer ops2")
    assert RING.grant("Bearer nope") is None
    assert RING.grant(None) is None and RING.grant("Basic acme-key") is None
    assert not KeyRing().enabled and RING.enabled


@given(tenant=st.text(min_size=1, max_size=20), claimed=st.text(min_size=1, max_size=20))
def test_a_tenant_key_never_acts_for_another_tenant(tenant: str, claimed: str) -> None:
    grant = Grant(tenant)
    assert KeyRing.tenant_for(grant, None) == tenant
    if claimed == tenant:
        assert KeyRing.tenant_for(grant, claimed) == tenant
    else:
        with pytest.raises(Forbidden):
            KeyRing.tenant_for(grant, claimed)
    assert KeyRing.tenant_for(Grant(None), claimed) == claimed


async def serve(ring: KeyRing) -> tuple[TestClient, GatedLifecycle]:
    lifecycle = GatedLifecycle()
    lifecycle.gate.set()
    config = ServiceConfig(worker_id="w1", keyring=ring, heartbeat_s=0.05)
    state = ServiceState(config=config, metrics=lifecycle.metrics, lifecycle=lifecycle)
    client = TestClient(TestServer(build_app(state)))
    await client.start_server()
    await wait_ready(client)
    return client, lifecycle


async def test_worker_binds_requests_to_the_tenant_of_their_key() -> None:
    client, lifecycle = await serve(RING)
    try:
        prompt = {"token_ids": list(range(10))}
        assert (await client.post("/v1/prefill", json=prompt)).status == 401
        own = await client.post("/v1/prefill", json=prompt, headers=bearer("acme-key"))
        assert own.status == 200
        claim = {**prompt, "tenant": "globex"}
        foreign = await client.post("/v1/prefill", json=claim, headers=bearer("acme-key"))
        assert foreign.status == 403 and "globex" in (await foreign.json())["error"]["message"]
        body = {"prompt": list(range(10)), "max_tokens": 1, "cache_salt": "globex"}
        salted = await client.post("/v1/completions", json=body, headers=bearer("acme-key"))
        assert salted.status == 403
        # globex asks for the very tokens acme cached: its own namespace, no hit.
        body = {"prompt": list(range(10)), "max_tokens": 1}
        other = await client.post("/v1/completions", json=body, headers=bearer("globex-key"))
        assert (await other.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        mine = await client.post("/v1/completions", json=body, headers=bearer("acme-key"))
        assert (await mine.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
        assert (await client.get("/v1/cache", headers=bearer("acme-key"))).status == 403
        assert (await client.get("/v1/cache", headers=bearer("op-key"))).status == 200
        assert (await client.get("/health/ready")).status == 200
        tenants = {e.tenant for e in lifecycle.sink.events if e.kind == "stored"}
        assert tenants == {"acme", "globex"}
    finally:
        await client.close()


async def test_the_single_shared_key_is_the_operator_key() -> None:
    client, _ = await serve(KeyRing("s3cret"))
    try:
        body = {"token_ids": list(range(10)), "tenant": "anyone"}
        assert (await client.post("/v1/prefill", json=body, headers=bearer("s3cret"))).status == 200
        assert (await client.get("/v1/cache", headers=bearer("s3cret"))).status == 200
    finally:
        await client.close()
