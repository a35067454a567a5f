"""Issue 14: the hot-token windows live in a changelog table, so a restarted streams app
(even on a fresh disk) resumes them instead of counting from zero."""

from __future__ import annotations

import uuid

import pytest

from schemas import QueryEvent, encode
from schemas.topics import RAG_QUERIES
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

TENANTS = ["t1", "t2", "t3", "t4"]  # spread over the partitions of rag.queries


def prefix(tenant: str, name: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{tenant}/{name}").hex


def send_queries(producer, topic: str, tenant: str, name: str, n: int) -> None:
    h = prefix(tenant, name)
    event = QueryEvent(tenant=tenant, question=f"{name}?", prefix_hash=h, block_hashes=[h],
                       prefix_tokens=64)
    for _ in range(n):
        producer.send(topic, key=tenant.encode(), value=encode(event))


def counts(app) -> dict[str, float]:
    return {row["prefix_hash"]: row["count"] for row in app.get("/ragwarm/hot")["top_prefixes"]}


def test_a_restarted_app_on_a_fresh_disk_resumes_its_hot_token_windows(
    kafka_producer, namespace, streams_factory, tmp_path
):
    topic = namespace + RAG_QUERIES
    for tenant in TENANTS:
        send_queries(kafka_producer, topic, tenant, "a", 5)
        send_queries(kafka_producer, topic, tenant, "b", 2)
    kafka_producer.flush()
    want = {prefix(t, n): float(c) for t in TENANTS for n, c in (("a", 5), ("b", 2))}
    first = streams_factory(namespace, "hot").start()
    wait_for(lambda: counts(first) == want, 180, f"the first app's windows to hold {want}")
    first.stop()

    fresh = tmp_path / "fresh-disk"
    env = {"RAGWARM_QDRANT_PATH": str(fresh / "qdrant"),
           "RAGWARM_STREAMS_DATA_DIR": str(fresh / "faust")}
    second = streams_factory(namespace, "hot", env).start()
    wait_for(lambda: counts(second) == want, 180, "the restarted app's windows to come back")
    assert second.counters().get("queries", 0) == 0  # recovered, not re-counted
    # And they go on from there.
    send_queries(kafka_producer, topic, "t3", "a", 1)
    kafka_producer.flush()
    want[prefix("t3", "a")] = 6.0
    wait_for(lambda: counts(second) == want, 120, "one more query counted on top")
