"""Issue 13's fuzz on the real topics: 10,000 bad records to each input topic, interleaved
with valid events: one dead letter with a reason per bad record, every valid event
processed, the same process before and after. The streams app's topics (kb.changes,
rag.queries, worker.events) in one test, a real worker's `warmup.commands` in the other.

The records come from the Hypothesis strategies of tests/fuzz_records.py over the JSON
Schemas, drawn from fixed seeds (the same ones on every run), each refused by
`schemas.decode`, so "bad" means what the consumers' decoder means, and each letter's
reason and field must be the decoder's.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from schemas import DeadLetter, KbChange, QueryEvent, WarmupCommand, WorkerEvent, decode, encode
from schemas.topics import (
    DEADLETTER,
    KB_CHANGES,
    RAG_QUERIES,
    WARMUP_COMMANDS,
    WORKER_EVENTS,
    kb_key,
)
from tests.fuzz_records import bad_records, refusal
from tests.integration.fuzz_kit import (
    MAX_REASON,
    MAX_VALUE,
    SEED,
    WORKER,
    addressed_elsewhere,
    worker_events,
)
from tests.integration.kafka_read import read_topic
from tests.integration.waiting import wait_for
from tests.integration.worker_proc import metric

pytestmark = pytest.mark.integration

BAD = 10_000  # to each topic
BATCH = 1_000  # records sent before the producer is flushed and their offsets read
STREAMS_TOPICS = {KB_CHANGES: KbChange, RAG_QUERIES: QueryEvent, WORKER_EVENTS: WorkerEvent}

Why = tuple[str, str | None]  # the decoder's reason and field


@dataclass
class Sent:
    """What was produced, by (topic, partition, offset): the decoder's (reason, field) of
    each bad record, the valid records, the bad ones for another worker; counts."""

    bad: dict[tuple[str, int, int], Why] = field(default_factory=dict)
    valid: list[tuple[str, int, int]] = field(default_factory=list)
    elsewhere: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes
    why: Why | None = None  # None: a valid event, or one for another worker
    elsewhere: bool = False


def key_for(topic: str, i: int) -> bytes | None:
    """Keys of all kinds, and none; a compacted topic (kb.changes) refuses a keyless record
    at the broker."""
    key = f"k{i % 97}".encode()
    return key if topic == KB_CHANGES else [None, b"", key][i % 3]


def bad_for(
    topic: str, model: type, at_seed: int, keep: Callable[[bytes], bool] | None = None
) -> tuple[list[Record], Counter[str]]:
    """10,000 records for `topic` that the decoder refuses, and how many of each kind."""
    drawn = bad_records(model, BAD, at_seed, keep)
    kinds = Counter(how for how, _, _ in drawn)
    rows = []
    for i, (_, raw, why) in enumerate(drawn):
        if len(raw) > MAX_VALUE:
            # The producer's limit: sent cut, which leaves it bad for a reason of its own.
            raw, why = raw[:MAX_VALUE], refusal(raw[:MAX_VALUE], model)
            kinds["cut to 1 MB"] += 1
            assert why is not None
        rows.append(Record(topic, key_for(topic, i), raw, why))
    return rows, kinds


def interleave(streams: list[list[Record]], valid: list[Record]) -> list[Record]:
    """One record of each topic in turn, the valid ones spread evenly among them."""
    merged = [r for row in zip(*streams, strict=True) for r in row]
    every = len(merged) // (len(valid) + 1)
    for n, record in enumerate(valid, 1):
        merged.insert(n * every + n - 1, record)
    return merged


def produce(bootstrap: str, options: dict, namespace: str, records: list[Record]) -> Sent:
    """Send in batches (each flushed, its offsets read)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                             max_request_size=MAX_VALUE + 4096, **options)  # fmt: skip
    sent = Sent()
    try:
        for start in range(0, len(records), BATCH):
            batch = records[start : start + BATCH]
            futures = []
            for r in batch:
                futures.append(producer.send(namespace + r.topic, key=r.key, value=r.value))
            producer.flush()
            for r, future in zip(batch, futures, strict=True):
                meta = future.get(timeout=60)
                origin = (meta.topic, meta.partition, meta.offset)
                if r.why is not None:
                    sent.bad[origin] = r.why
                else:
                    (sent.elsewhere if r.elsewhere else sent.valid).append(origin)
    finally:
        producer.close()
    return sent


def check_letters(bootstrap: str, namespace: str, sent: Sent, timeout_s: float) -> None:
    """Exactly one dead letter per bad record, none for a valid one; each letter's reason
    and field the decoder's (a cut payload's letter adds its size after the reason)."""
    letters = [
        decode(r.value, DeadLetter)
        for r in read_topic(bootstrap, namespace + DEADLETTER, len(sent.bad), timeout_s)
    ]
    assert len(letters) == len(sent.bad)
    by_origin = {(x.source_topic, x.partition, x.offset): x for x in letters}
    assert by_origin.keys() == sent.bad.keys()
    for origin, (reason, field_name) in sent.bad.items():
        letter = by_origin[origin]
        assert letter.reason.strip() and letter.reason.startswith(reason[:MAX_REASON])
        assert letter.error_field == field_name


# --- the streams app: kb.changes, rag.queries, worker.events ----------------------------------


def valid_events() -> list[Record]:
    docs = [KbChange(op="upsert", doc_id=f"fuzz{i}.md", version=i + 1,
                     text=f"Fuzz document {i}: the ferry leaves at {i + 6} o'clock.")
            for i in range(4)]  # fmt: skip
    queries = [QueryEvent(question=f"when does ferry {i} leave?", prefix_hash=f"{i:02x}" * 16,
                          block_hashes=[f"{i:02x}" * 16]) for i in range(10)]  # fmt: skip
    workers = [WorkerEvent(worker_id=f"fuzz-w{i}", kind="heartbeat", url=f"http://w{i}")
               for i in range(4)]  # fmt: skip
    return (
        [Record(KB_CHANGES, kb_key(d.tenant, d.doc_id), encode(d), None) for d in docs]
        + [Record(RAG_QUERIES, q.tenant.encode(), encode(q), None) for q in queries]
        + [Record(WORKER_EVENTS, w.worker_id.encode(), encode(w), None) for w in workers]
    )


@pytest.mark.timeout(2400)
def test_10000_bad_records_to_each_streams_topic_are_dead_lettered_and_valid_ones_processed(
    kafka_bootstrap, kafka_settings, namespace, streams_factory
):
    t0 = time.monotonic()
    drawn = [bad_for(t, m, SEED + n) for n, (t, m) in enumerate(sorted(STREAMS_TOPICS.items()))]
    records = interleave([rows for rows, _ in drawn], valid_events())
    kinds = sum((k for _, k in drawn), Counter())
    drawn_s = time.monotonic() - t0
    app = streams_factory(namespace, "fuzz").start()
    pid = app.proc.pid()
    sent = produce(kafka_bootstrap, kafka_settings.client_options(), namespace, records)
    produced_s = time.monotonic() - t0
    total = BAD * len(STREAMS_TOPICS)
    assert len(sent.bad) == total and len(sent.valid) == 18
    assert Counter(t for t, _, _ in sent.bad) == {namespace + t: BAD for t in STREAMS_TOPICS}

    wait_for(lambda: app.counters().get("dead_letters", 0) >= total, 1200, f"{total} letters")
    check_letters(kafka_bootstrap, namespace, sent, 600)
    print(
        f"\nfuzz (streams): {total} bad records ({dict(kinds)}) and 18 valid events; drawn "
        f"in {drawn_s:.0f} s, produced by {produced_s:.0f} s, all dead-lettered and checked "
        f"by {time.monotonic() - t0:.0f} s"
    )

    wait_for(lambda: app.counters().get("kb_events", 0) >= 4, 300, "the 4 KB changes")
    counters = app.counters()
    assert counters["dead_letters"] == total
    assert counters["kb_events"] == 4 and counters["queries"] == 10
    # Refused at once, as invalid: none taken for a transient failure and retried.
    assert counters.get("retries", 0) == 0 and counters.get("transient_dead_letters", 0) == 0
    assert app.get("/ragwarm/stats")["workers"] == 4
    docs = app.get("/ragwarm/docs")["docs"]
    assert len(docs) == 4 and sorted(d["version"] for d in docs.values()) == [1, 2, 3, 4]
    assert app.proc.pid() == pid
    assert httpx.get(app.url + "/ragwarm/health", timeout=10).status_code == 200


# --- a worker: warmup.commands --------------------------------------------------------------


def valid_commands() -> list[Record]:
    """Prefills of 3 blocks each (token ids well inside the vocabulary), to all workers."""
    commands = [
        WarmupCommand(command_id=f"fuzz-ok-{i}", op="prefill", ttl_s=600,
                      token_ids=[100 + 7 * i + j for j in range(48)])
        for i in range(10)
    ]  # fmt: skip
    return [Record(WARMUP_COMMANDS, None, encode(c)) for c in commands]


def elsewhere_commands() -> list[Record]:
    """Bad commands addressed to another worker: this one must leave them alone."""
    base = json.loads(encode(WarmupCommand(command_id="fuzz-x", op="prefill", token_ids=[1])))
    raws = [{**base, "worker_id": "fz-w2", "ttl_s": -i} for i in range(1, 26)]
    raws += [{**base, "worker_id": "fz-w2", "schema_version": 99 + i} for i in range(25)]
    return [Record(WARMUP_COMMANDS, b"k", json.dumps(r).encode(), elsewhere=True) for r in raws]


@pytest.mark.timeout(1800)
def test_10000_bad_commands_are_dead_lettered_by_the_worker_and_valid_ones_prefilled(
    kafka_bootstrap, kafka_settings, namespace, worker_factory
):
    t0 = time.monotonic()
    worker = worker_factory(WORKER, kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace,
                            env={"RAGWARM_WORKER_CACHE_REQUESTS": "false"}).start()  # fmt: skip
    # Drawn while the worker loads its model.
    rows, kinds = bad_for(WARMUP_COMMANDS, WarmupCommand, SEED + 7,
                          keep=lambda raw: not addressed_elsewhere(raw))  # fmt: skip
    worker.wait_ready()
    pid = worker.proc.pid
    records = interleave([rows], valid_commands() + elsewhere_commands())
    sent = produce(kafka_bootstrap, kafka_settings.client_options(), namespace, records)
    assert len(sent.bad) == BAD and len(sent.elsewhere) == 50 and len(sent.valid) == 10

    def malformed() -> float:
        return metric(worker.get("/metrics").text, "ragwarm_worker_commands_malformed_total")

    wait_for(lambda: malformed() >= BAD, 1200, f"{BAD} malformed commands counted")
    # One letter per bad command for this worker (or for all), none for another's.
    check_letters(kafka_bootstrap, namespace, sent, 600)
    ok = {f"fuzz-ok-{i}" for i in range(10)}

    def done() -> list[WorkerEvent] | None:
        events = worker_events(kafka_bootstrap, namespace)
        stored = {e.command_id for e in events if e.kind == "stored"}
        refused = [e for e in events if e.kind == "refused"]
        return events if stored >= ok and len(refused) >= BAD else None

    events = wait_for(done, 300, "the 10 valid prefills stored and every refusal reported")
    print(
        f"\nfuzz (worker): {BAD} bad commands ({dict(kinds)}), 50 for another worker and 10 "
        f"valid prefills; all dead-lettered and checked by {time.monotonic() - t0:.0f} s"
    )
    # Each bad command also refused to its sender on worker.events, with the reason.
    refused = [e for e in events if e.kind == "refused"]
    assert len(refused) == BAD and all(e.reason for e in refused)
    assert {e.command_id for e in events if e.kind == "stored"} == ok
    assert malformed() == BAD
    assert worker.proc.pid == pid and worker.proc.poll() is None
    assert worker.probe().status == 200
