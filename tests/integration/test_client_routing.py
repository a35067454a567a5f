"""RagClient against the real stack: streams app, two worker processes and Kafka."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from ragwarm.client.rag import RagClient
from ragwarm.client.settings import ClientSettings
from ragwarm.settings import KafkaSettings
from schemas.topics import RAG_QUERIES
from tests.integration.kb_stack import QUESTION, index_docs, logged_query
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

DOCS = ("docs/faq.md", "docs/developer-guide/ci.md")


def test_client_uses_the_worker_holding_the_prefix_and_survives_losing_it(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory
):
    # A dead worker stays in the table (no heartbeat timeout during the test) and nothing
    # gets hot-warmed behind the test's back: routing is decided by this test's prefill only.
    env = {"RAGWARM_STREAMS_WORKER_STALE_S": "900", "RAGWARM_STREAMS_HOT_MIN_COUNT": "1000"}
    app = streams_factory(namespace, "client", env).start()
    workers = {wid: worker_factory(wid, kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace)
               for wid in ("w1", "w2")}
    for proc in workers.values():
        proc.start()
    index_docs(app, workers.values(), kafka_producer, namespace, DOCS)

    settings = ClientSettings(streams_url=app.url, max_tokens=4)
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=namespace)
    with RagClient.open(settings, kafka) as client:
        prepared = client.prepare(QUESTION)
        assert prepared.chunks and prepared.prefix_hash
        assert "docs/faq.md" in {c.doc_id for c in prepared.chunks}
        # Warm the worker the router would NOT pick on load alone.
        holder = next(w for w in workers if w != client.route(prepared).chosen.worker_id)
        other = next(w for w in workers if w != holder)
        response = workers[holder].post("/v1/prefill", {
            "token_ids": list(prepared.prompt.prefix_ids), "tenant": prepared.tenant,
            "chunk_refs": [r.model_dump() for r in prepared.prompt.chunk_refs]})
        assert response.status_code == 200, response.text
        assert response.json()["prefix_hash"] == prepared.prefix_hash
        wait_for(lambda: client.route(prepared).chosen.worker_id == holder, 60,
                 "the router to learn the prefill")

        warm = client.ask(prepared)
        assert warm.worker_id == holder and warm.failed_workers == ()
        assert warm.cached_tokens >= prepared.chain.prefix_blocks * client.block_size
        assert warm.matched_blocks >= prepared.chain.prefix_blocks and warm.completion_tokens >= 1

        # Kill the holder without a goodbye: the table still names it, the client retries.
        os.killpg(workers[holder].proc.pid, signal.SIGKILL)
        workers[holder].proc.wait(30)
        assert client.route(prepared).chosen.worker_id == holder
        rescued = client.query(QUESTION)
        assert rescued.worker_id == other and rescued.failed_workers == (holder,)
        assert rescued.completion_tokens >= 1 and rescued.prompt_tokens == warm.prompt_tokens
        assert httpx.get(workers[other].url + "/health/ready", timeout=10).status_code == 200

    logged = logged_query(kafka_bootstrap, namespace + RAG_QUERIES, warm.qid)
    assert (logged.worker_id, logged.prefix_hash) == (holder, prepared.prefix_hash)
    assert logged.cached_tokens == warm.cached_tokens
    assert logged.block_hashes == list(prepared.prefix_hashes)
    assert [r.chunk_id for r in logged.chunk_refs] == [r.chunk_id for r in warm.chunk_refs]
    assert logged_query(kafka_bootstrap, namespace + RAG_QUERIES, rescued.qid).worker_id == other
