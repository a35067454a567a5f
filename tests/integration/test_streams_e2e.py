"""Issue 5 end to end: real Kafka, the streams app, a worker process, Qdrant local mode.

A hot question's prefix is warmed through the token-frequency path; editing a document
it depends on invalidates it on the worker and warms the new top-3 prefix; re-ingesting
identical content only extends TTLs (the scenario: `tests/integration/e2e_kit.py`).
"""

from __future__ import annotations

import pytest

from schemas.topics import KB_CHANGES
from tests.integration.e2e_kit import initial_docs, run_scenario
from tests.integration.kb_stack import send_docs

pytestmark = pytest.mark.integration


def test_edit_rewarms_new_prefix_and_identical_reingest_extends_ttl(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory
):
    docs = initial_docs()
    send_docs(kafka_producer, namespace + KB_CHANGES, list(docs.values()))
    app = streams_factory(namespace, "e2e", {"RAGWARM_STREAMS_HOT_MIN_COUNT": "2"}).start()
    worker = worker_factory(
        "w1",
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=namespace,
        env={"RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false"},
    )
    worker.start().wait_ready()
    try:
        run_scenario(kafka_bootstrap, kafka_producer, namespace, app, worker, docs)
    finally:
        worker.stop()  # before the namespace's topics are deleted
