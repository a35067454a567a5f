"""Query events sent while the broker is down reach rag.queries once it is back (issue 40).

A private broker (its own home, ports and data, sharing the fetched jars) is stopped for
10 s in the middle: the session's shared broker is never touched.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ragwarm.client.emitter import QueryEmitter
from ragwarm.kafka.admin import create_topics
from ragwarm.kafka.local import LocalKafka, LocalKafkaSettings
from ragwarm.ports import free_port
from ragwarm.settings import HomeSettings, KafkaSettings
from schemas import QueryEvent, decode
from schemas.topics import RAG_QUERIES, TOPICS
from tests.integration.kafka_read import read_topic

pytestmark = pytest.mark.integration


def _event(n: int) -> QueryEvent:
    return QueryEvent(tenant="outage", question=f"question {n}?", qid=f"q{n}",
                      prompt_tokens=10, ttft_ms=5.0)


def test_events_sent_while_the_broker_is_down_arrive_when_it_returns(tmp_path: Path) -> None:
    shared = LocalKafka(HomeSettings(), KafkaSettings(bootstrap=None))
    shared.ensure_jars()
    home = HomeSettings(home=tmp_path / "home")
    kafka = KafkaSettings(bootstrap=None, port=free_port(), controller_port=free_port())
    local = LocalKafkaSettings(jars_dir=shared.jars_dir.parent)
    broker = LocalKafka(home, kafka, local, say=print)
    broker.start()
    bootstrap = f"127.0.0.1:{kafka.port}"
    emitter = None
    try:
        create_topics(bootstrap, kafka.client_options(), [TOPICS[RAG_QUERIES]])
        emitter = QueryEmitter.open(kafka.model_copy(update={"bootstrap": bootstrap}))
        for n in range(3):
            emitter.emit(_event(n))
        emitter.producer.flush(timeout=30)

        broker.stop(force=True)
        down_at = time.monotonic()
        for n in range(3, 10):
            started = time.monotonic()
            emitter.emit(_event(n))
            assert time.monotonic() - started < 0.5, "an answer waited on the broker"
            time.sleep(1)
        time.sleep(max(0.0, 10 - (time.monotonic() - down_at)))
        broker.start()

        emitter.close(timeout_s=120)
        assert emitter.dropped == 0
        records = read_topic(bootstrap, RAG_QUERIES, expected=10, timeout_s=60)
        got = sorted({decode(r.value).qid for r in records}, key=lambda q: int(q[1:]))
        assert got == [f"q{n}" for n in range(10)]
    finally:
        if emitter is not None and emitter._thread.is_alive():
            emitter.close(timeout_s=1)
        broker.stop(force=True)
