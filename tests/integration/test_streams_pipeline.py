"""The streams app against the real Kafka: dead letters, idempotent replays, rebuilt tables."""

from __future__ import annotations

import json
import random

import pytest

from ragwarm.settings import TRACE_DIR
from schemas import DeadLetter, KbChange, decode, encode
from schemas.topics import DEADLETTER, KB_CHANGES
from tests.integration.kafka_read import subscriber
from tests.integration.streams_proc import StreamsApp
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

EVENTS = TRACE_DIR / "events.jsonl"


def trace_changes(limit_docs: int) -> list[KbChange]:
    """The trace's events for its first `limit_docs` documents, edits included, in order."""
    docs: list[str] = []
    changes = []
    with EVENTS.open() as f:
        for line in f:
            e = json.loads(line)
            if e["doc_id"] not in docs:
                if len(docs) >= limit_docs or not e["initial"]:
                    continue
                docs.append(e["doc_id"])
            changes.append(
                KbChange(op=e["op"], doc_id=e["doc_id"], version=e["seq"], text=e["text"])
            )
    return changes


def malformed(rng: random.Random, i: int) -> bytes:
    good = json.loads(encode(KbChange(op="upsert", doc_id=f"m{i}.md", version=1, text="x")))
    kind = i % 5
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    if kind == 1:
        return b'{"schema_name": "kb_change", "op": '
    if kind == 2:
        return json.dumps(good | {"version": "seven"}).encode()
    if kind == 3:
        return json.dumps(good | {"op": "rename"}).encode()
    return json.dumps(good | {"schema_name": "mystery"}).encode()


def produce(producer, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush()


def test_malformed_records_go_to_dead_letters_and_valid_ones_are_processed(
    kafka_bootstrap, kafka_producer, namespace, tmp_path
):
    valid = trace_changes(limit_docs=8)
    rng = random.Random(7)
    bad = [(f"bad{i}".encode(), malformed(rng, i)) for i in range(1000)]
    good = [(c.doc_id.encode(), encode(c)) for c in valid]
    mixed = bad[:500] + good[: len(good) // 2] + bad[500:] + good[len(good) // 2 :]

    app = StreamsApp(kafka_bootstrap, namespace, "dlq", tmp_path).start()
    try:
        pid = app.proc.pid()
        produce(kafka_producer, namespace + KB_CHANGES, mixed)
        wait_for(lambda: app.counters().get("dead_letters", 0) >= 1000, 240, "1000 dead letters")
        wait_for(
            lambda: (
                app.counters().get("kb_events", 0) + app.counters().get("stale_events", 0)
                >= len(valid)
            ),
            240,
            "every valid event",
        )
        assert app.proc.pid() == pid, "the Faust worker restarted"
        docs = app.get("/ragwarm/docs")["docs"]
        assert set(docs) == {c.doc_id for c in valid}
        last = {c.doc_id: c.version for c in valid}
        assert {d: s["version"] for d, s in docs.items()} == last
    finally:
        app.stop()

    consumer = subscriber(kafka_bootstrap, namespace + DEADLETTER, consumer_timeout_ms=5000)
    letters = [decode(m.value, DeadLetter) for m in consumer]
    consumer.close()
    assert len(letters) == 1000
    assert all(
        letter.reason and letter.source_topic == namespace + KB_CHANGES for letter in letters
    )
    originals = {v for _, v in bad}
    import base64

    assert {base64.b64decode(letter.value_b64) for letter in letters} == originals


def test_replay_rebuilds_the_same_tables_and_old_versions_change_nothing(
    kafka_bootstrap, kafka_producer, namespace, tmp_path
):
    changes = trace_changes(limit_docs=6)
    assert len(changes) > 6, "the slice must contain edits"
    produce(
        kafka_producer, namespace + KB_CHANGES, [(c.doc_id.encode(), encode(c)) for c in changes]
    )
    first = StreamsApp(kafka_bootstrap, namespace, "replay-a", tmp_path).start()
    try:
        wait_for(
            lambda: (
                first.counters().get("kb_events", 0) + first.counters().get("stale_events", 0)
                >= len(changes)
            ),
            300,
            "the first app to process the trace",
        )
        tables_a = first.get("/ragwarm/docs")

        # Old versions replayed into the running app change nothing.
        old = [
            c
            for c in changes
            if c.version < max(x.version for x in changes if x.doc_id == c.doc_id)
        ]
        before = first.counters().get("stale_events", 0)
        produce(
            kafka_producer, namespace + KB_CHANGES, [(c.doc_id.encode(), encode(c)) for c in old]
        )
        wait_for(
            lambda: first.counters().get("stale_events", 0) >= before + len(old),
            120,
            "the stale replays",
        )
        assert first.get("/ragwarm/docs") == tables_a
    finally:
        first.stop()

    second = StreamsApp(kafka_bootstrap, namespace, "replay-b", tmp_path).start()
    try:
        total = len(changes) + len(old)
        wait_for(
            lambda: (
                second.counters().get("kb_events", 0) + second.counters().get("stale_events", 0)
                >= total
            ),
            300,
            "the fresh app to replay from the beginning",
        )
        assert second.get("/ragwarm/docs") == tables_a
    finally:
        second.stop()
