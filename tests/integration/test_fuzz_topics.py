"""Issue 13's fuzz on the real topics: 10,000 bad records over the streams app's input
topics, interleaved with valid events: one dead letter with a reason per bad record, every
valid event processed, the same process before and after.

The records are the mutations of tests/unit/test_fuzz_records.py, drawn by a seeded
`random.Random` (the same 10,000 on every run) and each checked locally to be refused by
`schemas.decode`, so "bad" means what the app's decoder means. The worker's topic
(`warmup.commands`) is left to the unit fuzz of `CommandConsumer._dispatch`.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field

import httpx
import pytest

from schemas import (
    DeadLetter,
    KbChange,
    QueryEvent,
    SchemaError,
    WorkerEvent,
    decode,
    encode,
)
from schemas.topics import DEADLETTER, KB_CHANGES, RAG_QUERIES, WORKER_EVENTS, kb_key
from tests.integration.kafka_read import read_topic
from tests.integration.waiting import wait_for
from tests.unit.test_fuzz_records import VALID, _deep, _required

pytestmark = pytest.mark.integration

SEED = 13
BAD = 10_000
# The producer's (and the broker's) limit is about 1 MB a record: a larger bad record is
# sent cut to this size, which leaves it bad (a JSON text cut short never parses).
MAX_VALUE = 1_000_000
MAX_REASON = 4096  # a dead letter's reason is cut there
TOPICS = {KB_CHANGES: KbChange, RAG_QUERIES: QueryEvent, WORKER_EVENTS: WorkerEvent}
ODD = [None, True, 2**70, -(2**63) - 1, -1, math.nan, math.inf, -math.inf, 1e308, "", [], {},
       "\ud800", "\x00", [[[[[[1]]]]]]]  # fmt: skip
# Few of the large ones: each is a megabyte through a 2-core machine's broker and app.
RAW = [b"\xff\xfe{}", b"null", b"", b"[]", b"{", b'{"schema_name": NaN}', b"\x80abc",
       b'"kb_change"', b"Infinity"]  # fmt: skip


@dataclass
class Fuzz:
    """What was produced: the decoder's (reason, field) for the bad record at each (topic,
    partition, offset), and counts."""

    bad: dict[tuple[str, int, int], tuple[str, str | None]] = field(default_factory=dict)
    cut: int = 0
    kinds: dict[str, int] = field(default_factory=dict)


def mutate(rng: random.Random, model: type) -> tuple[str, bytes]:
    """One record that may not be a valid `model` event (the caller checks), and its kind."""
    base = json.loads(encode(VALID[model]))
    how = rng.choices(["drop", "retype", "version", "extra", "raw", "binary", "deep", "huge"],
                      [20, 30, 10, 10, 15, 10, 2, 0.5])[0]  # fmt: skip
    if how == "drop":
        base.pop(rng.choice(["schema_name", *_required(model)]))
    elif how == "retype":
        base[rng.choice(sorted(base))] = rng.choice(ODD)
    elif how == "version":
        base["schema_version"] = rng.choice([0, 4, 99, -1, "2", None, 2**64, 1.5])
    elif how == "extra":
        base["x" + str(rng.randrange(1000))] = 1
    elif how == "raw":
        return how, rng.choice(RAW)
    elif how == "binary":
        return how, rng.randbytes(rng.randrange(1, 65))
    elif how == "deep":
        return how, _deep(rng.choice([1_000, 100_000])).encode()
    else:
        base[rng.choice(sorted(base))] = "x" * rng.choice([100_000, 1_000_001, 4_000_001])
    return how, json.dumps(base, allow_nan=True, ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def refusal(raw: bytes, model: type) -> tuple[str, str | None] | None:
    """The reason and field `schemas.decode` refuses `raw` with; None if it is valid."""
    try:
        decode(raw, model)
    except SchemaError as exc:
        return str(exc), exc.field
    return None


def bad_record(rng: random.Random, model: type) -> tuple[str, bytes]:
    """A record `schemas.decode` refuses (a mutation that happens to stay valid is redrawn)."""
    while True:
        how, raw = mutate(rng, model)
        if refusal(raw, model) is not None:
            return how, raw


def valid_events() -> list[tuple[str, bytes | None, bytes]]:
    docs = [KbChange(op="upsert", doc_id=f"fuzz{i}.md", version=i + 1,
                     text=f"Fuzz document {i}: the ferry leaves at {i + 6} o'clock.")
            for i in range(3)]  # fmt: skip
    queries = [QueryEvent(question=f"when does ferry {i} leave?", prefix_hash=f"{i:02x}" * 16,
                          block_hashes=[f"{i:02x}" * 16]) for i in range(5)]  # fmt: skip
    workers = [WorkerEvent(worker_id=f"fuzz-w{i}", kind="heartbeat", url=f"http://w{i}")
               for i in range(2)]  # fmt: skip
    return (
        [(KB_CHANGES, kb_key(d.tenant, d.doc_id), encode(d)) for d in docs]
        + [(RAG_QUERIES, q.tenant.encode(), encode(q)) for q in queries]
        + [(WORKER_EVENTS, w.worker_id.encode(), encode(w)) for w in workers]
    )


def produce(producer, namespace: str) -> Fuzz:
    """10,000 bad records spread over the topics, the valid events among them at fixed places."""
    rng, fuzz = random.Random(SEED), Fuzz()
    valid = valid_events()
    every = BAD // (len(valid) + 1)
    futures, expected = [], []
    for i in range(BAD):
        if i % every == every // 2 and valid:
            topic, key, value = valid.pop(0)
            producer.send(namespace + topic, key=key, value=value)
        topic = rng.choice(sorted(TOPICS))
        how, raw = bad_record(rng, TOPICS[topic])
        fuzz.kinds[how] = fuzz.kinds.get(how, 0) + 1
        if len(raw) > MAX_VALUE:
            raw, fuzz.cut = raw[:MAX_VALUE], fuzz.cut + 1
        # A compacted topic (kb.changes) refuses a record without a key at the broker.
        keys = [b"k", rng.randbytes(8)] + ([] if topic == KB_CHANGES else [None, b""])
        key = rng.choice(keys)
        futures.append(producer.send(namespace + topic, key=key, value=raw))
        expected.append(refusal(raw, TOPICS[topic]))
    producer.flush()
    for future, why in zip(futures, expected, strict=True):
        meta = future.get(timeout=60)
        fuzz.bad[(meta.topic, meta.partition, meta.offset)] = why
    return fuzz


def test_10000_bad_records_are_dead_lettered_and_the_valid_ones_processed(
    kafka_bootstrap, kafka_settings, namespace, streams_factory
):
    from kafka import KafkaProducer

    app = streams_factory(namespace, "fuzz").start()
    pid = app.proc.pid()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20,
                             max_request_size=MAX_VALUE + 4096,
                             **kafka_settings.client_options())  # fmt: skip
    t0 = time.monotonic()
    try:
        fuzz = produce(producer, namespace)
    finally:
        producer.close()
    produced_s = time.monotonic() - t0
    assert len(fuzz.bad) == BAD

    wait_for(lambda: app.counters().get("dead_letters", 0) >= BAD, 300, "10,000 dead letters")
    letters = [
        decode(r.value, DeadLetter)
        for r in read_topic(kafka_bootstrap, namespace + DEADLETTER, expected=BAD, timeout_s=120)
    ]
    print(
        f"fuzz: {BAD} bad records ({fuzz.kinds}, {fuzz.cut} cut to {MAX_VALUE} bytes) "
        f"produced in {produced_s:.1f} s, all dead-lettered after {time.monotonic() - t0:.1f} s"
    )
    assert len(letters) == BAD
    by_origin = {(x.source_topic, x.partition, x.offset): x for x in letters}
    assert by_origin.keys() == fuzz.bad.keys()
    for origin, (reason, field_name) in fuzz.bad.items():
        # The decoder's own reason (a cut payload's letter adds its size after it).
        letter = by_origin[origin]
        assert letter.reason.strip() and letter.reason.startswith(reason[:MAX_REASON])
        assert letter.error_field == field_name

    wait_for(lambda: app.counters().get("kb_events", 0) >= 3, 120, "the 3 KB changes")
    counters = app.counters()
    assert counters["dead_letters"] == BAD
    assert counters["kb_events"] == 3 and counters["queries"] == 5
    # Refused at once, as invalid: none taken for a transient failure and retried.
    assert counters.get("retries", 0) == 0 and counters.get("transient_dead_letters", 0) == 0
    assert app.get("/ragwarm/stats")["workers"] == 2
    docs = app.get("/ragwarm/docs")["docs"]
    assert len(docs) == 3 and sorted(d["version"] for d in docs.values()) == [1, 2, 3]
    assert app.proc.pid() == pid
    assert httpx.get(app.url + "/ragwarm/health", timeout=10).status_code == 200
