"""A running stack with the Argo CD trace's first documents indexed, for the client and gateway
tests: the documents' first versions, sent and indexed, and the workers ready in the app's table;
the gateway process over it."""

from __future__ import annotations

import json

from kafka import KafkaProducer

from ragwarm.ports import free_port
from ragwarm.settings import TRACE_DIR
from ragwarm.stack.procs import Proc
from schemas import KbChange, QueryEvent, decode, encode
from schemas.topics import KB_CHANGES
from tests.integration.kafka_read import subscriber
from tests.integration.waiting import wait_for

EVENTS = TRACE_DIR / "events.jsonl"
QUESTION = "I forgot the admin password, how do I reset it?"


def initial_changes(doc_ids: tuple[str, ...]) -> list[KbChange]:
    changes = []
    with EVENTS.open() as f:
        for line in f:
            e = json.loads(line)
            if e["initial"] and e["doc_id"] in doc_ids:
                changes.append(KbChange(op="upsert", doc_id=e["doc_id"], version=e["seq"],
                                        text=e["text"]))
    return changes


def ready_workers(app) -> set[str]:
    return {w["worker_id"] for w in app.get("/ragwarm/workers")["workers"]
            if w.get("ready") and w.get("url")}


def index_docs(app, workers, producer, namespace: str,
               doc_ids: tuple[str, ...]) -> list[KbChange]:
    """Send the documents' first versions to `kb.changes` (returned); return once the started
    worker processes `workers` are ready, the app has indexed every document and lists
    exactly those workers as ready."""
    changes = initial_changes(doc_ids)
    for change in changes:
        producer.send(namespace + KB_CHANGES, key=change.doc_id.encode(), value=encode(change))
    producer.flush()
    for proc in workers:
        proc.wait_ready()
    wait_for(lambda: app.counters().get("kb_events", 0) >= len(changes), 300, "indexing")
    ids = {proc.worker_id for proc in workers}
    wait_for(lambda: ready_workers(app) == ids, 120, f"workers {sorted(ids)} in the table")
    return changes


def gateway_proc(workdir, env: dict[str, str]) -> Proc:
    """`ragwarm gateway` on a free port with `env`, healthy."""
    port = free_port()
    workdir.mkdir(exist_ok=True)
    proc = Proc("gateway", ["gateway", "--port", str(port)], workdir,
                f"http://127.0.0.1:{port}/health/ready", env)
    proc.start()
    proc.wait_healthy(180)
    return proc


def logged_query(bootstrap: str, topic: str, qid: str) -> QueryEvent:
    consumer = subscriber(bootstrap, topic, consumer_timeout_ms=20_000)
    try:
        for message in consumer:
            event = decode(message.value, QueryEvent)
            if event.qid == qid:
                assert message.key == event.tenant.encode()
                return event
    finally:
        consumer.close()
    raise AssertionError(f"query {qid} not found on {topic}")


def send_docs(producer: KafkaProducer, topic: str, docs: list[KbChange]) -> None:
    for doc in docs:
        producer.send(topic, key=doc.doc_id.encode(), value=encode(doc))
    producer.flush()
