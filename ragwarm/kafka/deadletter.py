"""Dead letters: read `ragwarm.deadletter`, and re-send letters to their original topics.

A letter carries the original key and value (or, for a large record, the value's head with
its size and sha256: the whole original is then read back from its topic and offset).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from schemas import DeadLetter, SchemaError, decode

# The original record of a truncated letter: (topic, partition, offset) -> value.
FetchOriginal = Callable[[str, int, int], bytes | None]


@dataclass(frozen=True)
class Letter:
    """One dead letter and where it sits on the dead-letter topic."""

    partition: int
    offset: int
    letter: DeadLetter


@dataclass(frozen=True)
class Redrive:
    """What re-sending one letter does: the record to send, or why it cannot be sent."""

    letter: Letter
    topic: str
    key: bytes | None = None
    value: bytes | None = None
    skipped: str | None = None


def select(letters: Iterable[Letter], reason: str | None) -> list[Letter]:
    """The letters whose reason contains `reason` (case-insensitive); all when None."""
    if not reason:
        return list(letters)
    needle = reason.lower()
    return [x for x in letters if needle in x.letter.reason.lower()]


def plan_redrive(letter: Letter, fetch: FetchOriginal) -> Redrive:
    """The original record of `letter`, checked against its sha256 when it was truncated."""
    dl = letter.letter
    key = base64.b64decode(dl.key_b64) if dl.key_b64 is not None else None
    if not dl.truncated:
        return Redrive(letter, dl.source_topic, key, base64.b64decode(dl.value_b64))
    if dl.partition is None or dl.offset is None:
        return Redrive(letter, dl.source_topic, skipped="truncated, with no offset to read from")
    value = fetch(dl.source_topic, dl.partition, dl.offset)
    if value is None:
        return Redrive(letter, dl.source_topic, skipped="original no longer in its topic")
    if hashlib.sha256(value).hexdigest() != dl.value_sha256:
        return Redrive(letter, dl.source_topic, skipped="original at that offset differs")
    return Redrive(letter, dl.source_topic, key, value)


def summary(x: Letter) -> dict[str, Any]:
    dl = x.letter
    return {
        "at": f"{x.partition}@{x.offset}",
        "source": f"{dl.source_topic}[{dl.partition}]@{dl.offset}",
        "bytes": dl.value_bytes or len(base64.b64decode(dl.value_b64)),
        "truncated": dl.truncated,
        "reason": dl.reason,
        "timestamp": dl.timestamp.isoformat(),
    }


# --- Kafka I/O (kafka-python) ----------------------------------------------------------------


def read_letters(bootstrap: str, options: Mapping[str, Any], topic: str) -> Iterator[Letter]:
    """Every letter on `topic`, from the beginning to its current end; others are skipped."""
    for record in _read_all(bootstrap, options, topic):
        try:
            letter = decode(record.value, DeadLetter)
        except SchemaError:
            continue
        yield Letter(record.partition, record.offset, letter)  # type: ignore[arg-type]


def _read_all(bootstrap: str, options: Mapping[str, Any], topic: str) -> Iterator[Any]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **options)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        while any(consumer.position(tp) < end[tp] for tp in parts):
            for records in consumer.poll(timeout_ms=1000).values():
                yield from records
    finally:
        consumer.close()


def original_fetcher(bootstrap: str, options: Mapping[str, Any]) -> FetchOriginal:
    """Reads one record back from its topic, partition and offset (None once it is gone)."""

    def fetch(topic: str, partition: int, offset: int) -> bytes | None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, max_partition_fetch_bytes=8 << 20, **options
        )
        try:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            if consumer.beginning_offsets([tp])[tp] > offset:
                return None
            consumer.seek(tp, offset)
            for _ in range(20):
                for record in consumer.poll(timeout_ms=1000).get(tp, []):
                    return record.value if record.offset == offset else None
            return None
        finally:
            consumer.close()

    return fetch


def send_all(
    bootstrap: str, options: Mapping[str, Any], redrives: Iterable[Redrive]
) -> int:
    """Send every redrive that has a record, acks=all; how many were sent."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=8 << 20, **options
    )
    sent = 0
    try:
        for r in redrives:
            if r.skipped is None:
                producer.send(r.topic, key=r.key, value=r.value).get(timeout=60)
                sent += 1
    finally:
        producer.close()
    return sent
