"""Issue 40: with the streams app stopped, RagClient still answers (routing by load to the
worker it last learned), and a prompt that worker holds still reports cached tokens."""

from __future__ import annotations

import pytest

from ragwarm.client.fallback import FALLBACK, ROUTED
from ragwarm.client.rag import RagClient
from ragwarm.client.settings import ClientSettings
from ragwarm.client.wire import StreamsUnavailable
from ragwarm.settings import KafkaSettings
from tests.integration.kb_stack import QUESTION, index_docs

pytestmark = pytest.mark.integration


def test_a_prepared_query_is_answered_warm_after_the_streams_app_stops(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory
):
    env = {"RAGWARM_STREAMS_WORKER_STALE_S": "900", "RAGWARM_STREAMS_HOT_MIN_COUNT": "1000"}
    app = streams_factory(namespace, "fallback", env).start()
    worker = worker_factory("w1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace).start()
    index_docs(app, [worker], kafka_producer, namespace, ("docs/faq.md",))

    # Retrieval through the streams app: the query is prepared while it is up.
    settings = ClientSettings(streams_url=app.url, max_tokens=4, retrieval="streams")
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=namespace)
    with RagClient.open(settings, kafka) as client:
        prepared = client.prepare(QUESTION)
        assert prepared.chunks and prepared.prefix_hash
        first = client.ask(prepared)  # the worker computes and keeps the prompt's blocks
        held = client.ask(prepared)
        assert (first.routing, held.routing, held.worker_id) == (ROUTED, ROUTED, "w1")
        assert held.cached_tokens > 0

        app.stop()
        fallback = client.ask(prepared)
        assert (fallback.worker_id, fallback.routing) == ("w1", FALLBACK)
        assert fallback.failed_workers == () and fallback.matched_blocks == 0
        assert fallback.cached_tokens > 0 and fallback.completion_tokens >= 1
        assert fallback.prompt_tokens == held.prompt_tokens

        # A new question needs retrieval, which this client does through the stopped app.
        with pytest.raises(StreamsUnavailable, match="RAGWARM_QDRANT_URL"):
            client.query("How do I disable the admin user?")
