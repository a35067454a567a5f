"""Tenants on the real streams app: keys on the views, retrieval scoped to the key's tenant."""

from __future__ import annotations

import json

import httpx
import pytest

from schemas import KbChange, encode
from schemas.topics import KB_CHANGES
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

KEYS = {"acme": "acme-key", "globex": "globex-key"}
ENV = {
    "RAGWARM_STREAMS_API_KEY": "operator-key",
    "RAGWARM_STREAMS_TENANT_KEYS": json.dumps(KEYS),
}
TEXT = {
    "acme": "Acme rotates the vault password every Tuesday with the blue lever.",
    "globex": "Globex rotates the vault password every Friday with the red crank.",
}


def retrieve(app, body: dict, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{app.url}/ragwarm/retrieve", json=body, headers=headers, timeout=60)


def test_views_need_a_key_and_a_tenant_key_sees_only_its_tenant(
    kafka_producer, namespace, streams_factory
) -> None:
    for tenant, text in TEXT.items():
        change = KbChange(op="upsert", doc_id=f"{tenant}/vault.md", version=1, tenant=tenant,
                          text=text)  # fmt: skip
        kafka_producer.send(namespace + KB_CHANGES, key=change.doc_id.encode(),
                            value=encode(change))  # fmt: skip
    kafka_producer.flush()
    app = streams_factory(namespace, "tenants", ENV).start()
    wait_for(lambda: app.counters().get("kb_events", 0) >= 2, 240, "both documents indexed")
    question = {"question": "How is the vault password rotated?", "k": 5}

    assert retrieve(app, question, None).status_code == 401
    assert httpx.get(f"{app.url}/ragwarm/health", timeout=10).status_code == 200
    assert httpx.get(f"{app.url}/ragwarm/docs", timeout=10).status_code == 401
    for tenant, key in KEYS.items():
        chunks = retrieve(app, question, key).json()["chunks"]
        assert chunks and all(c["text"] == TEXT[tenant] for c in chunks), chunks
        other = next(t for t in KEYS if t != tenant)
        assert retrieve(app, {**question, "tenant": other}, key).status_code == 403
        assert retrieve(app, {**question, "tenant": tenant}, key).status_code == 200
        docs = httpx.get(f"{app.url}/ragwarm/docs", timeout=10,
                         headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        assert docs.status_code == 403
    operator = retrieve(app, question, "operator-key")
    assert operator.status_code == 400 and "tenant" in operator.text
    both = retrieve(app, {**question, "tenant": "globex"}, "operator-key").json()["chunks"]
    assert [c["text"] for c in both] == [TEXT["globex"]]
    assert app.get("/ragwarm/docs")  # the operator key reads state
