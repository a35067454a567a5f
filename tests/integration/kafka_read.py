"""Reads a whole topic from the beginning with kafka-python, for the integration tests."""

from __future__ import annotations

import time

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from ragwarm.settings import KafkaSettings

# kafka-python assigns a subscribed topic's partitions from its cluster metadata; a consumer
# whose first metadata lacked them reads nothing until the next refresh, by default 300 s
# on (test_scale_out under load: an invalidation sent within a minute was seen after
# 300.0 s, and the three sent with it at once). The tests' readers refresh every 3 s.
METADATA_MAX_AGE_MS = 3000


def subscriber(bootstrap: str, topic: str, **options) -> KafkaConsumer:
    """A consumer of `topic` from its beginning, in no group (`options`: kafka-python's)."""
    return KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         metadata_max_age_ms=METADATA_MAX_AGE_MS, **options)


def partitions(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    """The topic's partitions; a new consumer may not have its metadata yet, so ask again."""
    deadline = time.monotonic() + 20
    while True:
        found = consumer.partitions_for_topic(topic)
        if found or time.monotonic() > deadline:
            return [TopicPartition(topic, p) for p in sorted(found or ())]
        time.sleep(0.2)


def read_topic(
    bootstrap: str, topic: str, expected: int | None = None, timeout_s: float = 60.0
) -> list[ConsumerRecord]:
    """Every record of `topic`: polls until `expected` came (default: the end offsets'
    sum) or `timeout_s` passed, then once more so extra records would show."""
    options = KafkaSettings().client_options()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **options)
    try:
        parts = partitions(consumer, topic)
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        if expected is None:
            expected = sum(consumer.end_offsets(parts).values())
        got: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            got.extend(r for rs in consumer.poll(timeout_ms=500).values() for r in rs)
        got.extend(r for rs in consumer.poll(timeout_ms=1000).values() for r in rs)
        return got
    finally:
        consumer.close()
