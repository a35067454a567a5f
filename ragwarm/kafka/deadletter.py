"""Dead letters: read `ragwarm.deadletter`, and re-send letters to their original topics.

A letter carries the original key and value (or, for a large record, the value's head with
its size and sha256: the whole original is then read back from its topic and offset).

Anyone who can write the dead-letter topic can write a letter, and a redrive sends it with
the operator's credentials: so a letter is only sent to a topic ragwarm's consumers
dead-letter from (`REDRIVE_TOPICS`, or the operator's list), and each letter sent is
marked on the dead-letter topic itself (a `redrive_mark` record keyed by the letter's
partition and offset, sent after the record, acks=all), so a second redrive skips it. The
mark lives as long as the letters (the topic's retention); a redrive that dies between a
send and its mark sends that one letter again next time (at least once).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from schemas import DeadLetter, SchemaError, decode
from schemas.topics import KB_CHANGES, RAG_CHUNKS, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS

# The topics whose consumers send dead letters (before the deployment's topic prefix): the
# external ones, and the streams app's internal ones (`streams.shell.topics`, named here so the
# CLI does not load Faust).
REDRIVE_TOPICS = (KB_CHANGES, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS, RAG_CHUNKS,
                  "ragwarm.prefix-ops", "ragwarm.doc-links", "ragwarm.worker-ready")
MARK = "redrive_mark"

# The original record of a truncated letter: (topic, partition, offset) -> value.
FetchOriginal = Callable[[str, int, int], bytes | None]


@dataclass(frozen=True)
class Letter:
    """One dead letter and where it sits on the dead-letter topic."""

    partition: int
    offset: int
    letter: DeadLetter
    redriven: str | None = None  # when a redrive sent it (its mark's time), if one did


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


def plan_redrive(
    letter: Letter, fetch: FetchOriginal, allowed: Collection[str], again: bool = False
) -> Redrive:
    """The original record of `letter`, checked against its sha256 when it was truncated;
    skipped when its topic is not in `allowed`, or when it was sent before (unless `again`)."""
    dl = letter.letter
    if dl.source_topic not in allowed:
        return Redrive(letter, dl.source_topic, skipped=(
            f"refused: topic {dl.source_topic!r} is not one ragwarm dead-letters from "
            f"(allowed: {', '.join(sorted(allowed))}; --allow-topic to change)"))
    if letter.redriven is not None and not again:
        return Redrive(letter, dl.source_topic,
                       skipped=f"already redriven at {letter.redriven} (--again to resend)")
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


def mark_key(letter: Letter) -> bytes:
    return f"{MARK}:{letter.partition}:{letter.offset}".encode()


def mark_value(letter: Letter, topic: str, at: datetime | None = None) -> bytes:
    """The record saying that `letter` was sent to `topic` (at `at`, now by default)."""
    when = (at or datetime.now(UTC)).isoformat()
    return json.dumps({"schema_name": MARK, "partition": letter.partition,
                       "offset": letter.offset, "topic": topic, "at": when}).encode()


def read_mark(value: bytes | None) -> tuple[int, int, str] | None:
    """(partition, offset, when) of a mark record; None for anything else."""
    try:
        raw = json.loads(value or b"")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(raw, dict) or raw.get("schema_name") != MARK:
        return None
    part, offset, at = raw.get("partition"), raw.get("offset"), raw.get("at")
    if isinstance(part, int) and isinstance(offset, int) and isinstance(at, str):
        return part, offset, at
    return None


def with_marks(records: Iterable[Any]) -> list[Letter]:
    """The letters among the dead-letter topic's `records`, each with its mark if any."""
    letters: list[Letter] = []
    marks: dict[tuple[int, int], str] = {}
    for record in records:
        if (mark := read_mark(record.value)) is not None:
            marks[mark[:2]] = mark[2]
            continue
        try:
            letter = decode(record.value, DeadLetter)
        except SchemaError:
            continue
        letters.append(Letter(record.partition, record.offset, letter))  # type: ignore[arg-type]
    return [replace(x, redriven=marks.get((x.partition, x.offset))) for x in letters]


def summary(x: Letter) -> dict[str, Any]:
    dl = x.letter
    return {
        "at": f"{x.partition}@{x.offset}",
        "source": f"{dl.source_topic}[{dl.partition}]@{dl.offset}",
        "bytes": dl.value_bytes or len(base64.b64decode(dl.value_b64)),
        "truncated": dl.truncated,
        "reason": dl.reason,
        "timestamp": dl.timestamp.isoformat(),
        "redriven": x.redriven,
    }


# --- Kafka I/O (kafka-python) ----------------------------------------------------------------


def read_letters(bootstrap: str, options: Mapping[str, Any], topic: str) -> list[Letter]:
    """Every letter on `topic`, from the beginning to its current end, with its redrive
    mark; other records are skipped."""
    return with_marks(_read_all(bootstrap, options, topic))


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
    bootstrap: str, options: Mapping[str, Any], redrives: Iterable[Redrive], deadletters: str
) -> int:
    """Send every redrive that has a record, acks=all, then its mark on `deadletters`; how
    many were sent."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=8 << 20, **options
    )
    sent = 0
    try:
        for r in redrives:
            if r.skipped is None:
                producer.send(r.topic, key=r.key, value=r.value).get(timeout=60)
                producer.send(deadletters, key=mark_key(r.letter),
                              value=mark_value(r.letter, r.topic)).get(timeout=60)
                sent += 1
    finally:
        producer.close()
    return sent
