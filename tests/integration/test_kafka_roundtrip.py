"""KbChange events survive a trip through the real broker byte for byte."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from kafka import KafkaProducer

from ragwarm.settings import KafkaSettings
from schemas import KbChange, decode, encode
from tests.integration.kafka_read import read_topic

pytestmark = pytest.mark.integration

N_EVENTS = 1_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _event(i: int) -> KbChange:
    doc = f"doc-{i % 97}"
    stamp = T0 + timedelta(milliseconds=i)
    if i % 5 == 0:
        return KbChange(op="delete", doc_id=doc, version=i, tenant="t1", timestamp=stamp)
    return KbChange(
        op="upsert",
        doc_id=doc,
        version=i,
        tenant=f"t{i % 3}",
        text=f"Paragraph {i}: 缓存预热 — café ✓ " * (1 + i % 7),
        metadata={"source": "test", "page": i, "score": i / 7, "draft": i % 2 == 0, "n": None},
        timestamp=stamp,
    )


def _consume(bootstrap: str, topic: str, count: int, options: dict) -> list[KbChange]:
    return [decode(r.value, KbChange) for r in read_topic(bootstrap, topic, count)]


def test_thousand_kb_changes_round_trip(
    kafka_bootstrap: str,
    kafka_settings: KafkaSettings,
    kafka_producer: KafkaProducer,
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic("roundtrip", partitions=4)
    sent = [_event(i) for i in range(N_EVENTS)]
    for event in sent:
        kafka_producer.send(topic, key=event.doc_id.encode(), value=encode(event))
    kafka_producer.flush(timeout=60)

    got = _consume(kafka_bootstrap, topic, N_EVENTS, kafka_settings.client_options())

    assert len(got) == N_EVENTS
    assert sorted(got, key=lambda e: e.version) == sent
