"""Reads from the broker with kafka-python, for the integration tests: a whole topic from the
beginning, one worker's events, a consumer group's committed offsets and members."""

from __future__ import annotations

import time
from collections.abc import Callable

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from ragwarm.kafka.admin import admin_client
from ragwarm.settings import KafkaSettings
from schemas import WorkerEvent, decode

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


def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    with admin_client(bootstrap, KafkaSettings().client_options()) as admin:
        found = admin.list_group_offsets(group).get(group, {})
    return {tp.partition: meta.offset for tp, meta in found.items()}


def wait_group_empty(bootstrap: str, group: str, timeout_s: float = 90.0) -> None:
    """Until the broker drops a killed member from `group` (its session times out): a
    member joining before that waits for the dead one through a whole rebalance timeout."""
    with admin_client(bootstrap, KafkaSettings().client_options(), timeout_s) as admin:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not admin.describe_groups([group])[group]["members"]:
                return
            time.sleep(1.0)
    raise AssertionError(f"group {group} still has members after {timeout_s} s")


class WorkerEvents:
    """Reads one worker's events from `worker.events` (all partitions, no group)."""

    def __init__(self, bootstrap: str, topic: str, worker_id: str, *, from_start: bool) -> None:
        self.worker_id = worker_id.encode()
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            **KafkaSettings().client_options(),
        )
        partitions = None
        while not partitions:
            partitions = self.consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        self.consumer.assign(tps)
        if from_start:
            self.consumer.seek_to_beginning(*tps)
        else:
            self.consumer.seek_to_end(*tps)
        for tp in tps:
            self.consumer.position(tp)  # resolve the seek now, before anything is sent
        self.seen: list[tuple[bytes | None, WorkerEvent]] = []

    def wait_for(
        self, match: Callable[[WorkerEvent], bool], what: str, timeout_s: float = 90.0
    ) -> WorkerEvent:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for records in self.consumer.poll(timeout_ms=500).values():
                for record in records:
                    event = decode(record.value, WorkerEvent)
                    assert isinstance(event, WorkerEvent)
                    self.seen.append((record.key, event))
            for key, event in self.seen:
                if key == self.worker_id and match(event):
                    return event
        kinds = [e.kind for _, e in self.seen]
        raise AssertionError(f"no {what} event within {timeout_s} s; seen kinds: {kinds}")

    def close(self) -> None:
        self.consumer.close()
