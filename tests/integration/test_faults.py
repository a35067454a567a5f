"""Issue 12, faults lose nothing: each test reproduces one defect of the issue's Why list
against the real broker, the streams app (Qdrant local mode, the real embedder) and, where
it matters, a real worker process."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from kafka import KafkaConsumer, TopicPartition

from ragwarm.kafka.admin import create_topics
from ragwarm.kafka.local import LocalKafka
from ragwarm.ports import free_port
from ragwarm.settings import HomeSettings, KafkaSettings
from schemas import DeadLetter, KbChange, QueryEvent, decode, encode
from schemas.topics import DEADLETTER, KB_CHANGES, RAG_QUERIES, TopicSpec
from tests.integration.e2e_kit import QUESTION, Client, Events, initial_docs
from tests.integration.kafka_read import read_topic, subscriber
from tests.integration.kb_stack import send_docs
from tests.integration.streams_proc import StreamsApp, wait_ready
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

RAGWARM = Path(sys.executable).parent / "ragwarm"


def letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    consumer = subscriber(bootstrap, topic, consumer_timeout_ms=3000)
    found = [decode(m.value, DeadLetter) for m in consumer]
    consumer.close()
    return found


# --- a record too large for its own dead letter --------------------------------------------


def test_an_800kb_invalid_record_gives_one_dead_letter_before_its_offset_is_committed(
    kafka_bootstrap, kafka_producer, namespace, streams_factory
):
    """Before: the base64 dead letter exceeded the producer's max request size, the send
    raised inside the agent and the offset was committed: the record was lost."""
    big = json.dumps(
        {"schema_name": "kb_change", "op": "rename", "doc_id": "big.md", "version": 1,
         "text": "x" * 800_000}
    ).encode()
    ok = KbChange(op="upsert", doc_id="after.md", version=1, text="A document after it.")
    topic = namespace + KB_CHANGES
    meta = kafka_producer.send(topic, key=b"big.md", value=big).get(timeout=30)
    kafka_producer.send(topic, key=b"big.md", value=encode(ok))
    kafka_producer.flush()
    app = streams_factory(namespace, "big").start()
    wait_for(lambda: app.counters().get("kb_events", 0) >= 1, 180, "the record after it")
    found = letters(kafka_bootstrap, namespace + DEADLETTER)
    assert len(found) == 1
    (letter,) = found
    assert letter.truncated and letter.value_bytes == len(big)
    assert letter.value_sha256 == hashlib.sha256(big).hexdigest()
    assert (letter.partition, letter.offset) == (meta.partition, meta.offset)
    assert big.startswith(base64.b64decode(letter.value_b64))
    assert app.counters()["dead_letters"] == 1

    # Reads the app's committed offset without joining its group.
    group = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=namespace + "big", enable_auto_commit=False
    )
    try:
        tp = TopicPartition(topic, meta.partition)
        wait_for(
            lambda: (group.committed(tp) or -1) > meta.offset, 60, "the offset committed past it"
        )
    finally:
        group.close()


# --- a timer that raises -------------------------------------------------------------------


def test_a_raising_timer_keeps_the_app_and_itself_running(
    kafka_bootstrap, kafka_settings, kafka_producer, namespace, streams_factory
):
    """Before: an exception in a timer ended it (and, in Faust, could stop the app). A row
    of the prefixes table that no longer parses makes the sweep and resend timers raise on
    every tick."""
    app_id = namespace + "timers"
    changelog = f"{app_id}-prefixes-changelog"
    spec = TopicSpec(changelog, "table key", 4, {"cleanup.policy": "compact"})
    create_topics(kafka_bootstrap, kafka_settings.client_options(), [spec])
    for partition in range(4):
        kafka_producer.send(
            changelog, key=json.dumps(f"bad{partition}").encode(),
            value=json.dumps({"not": "a prefix state"}).encode(), partition=partition,
        )
    kafka_producer.flush()
    env = {"RAGWARM_STREAMS_SWEEP_S": "1", "RAGWARM_STREAMS_RESEND_S": "1"}
    app = streams_factory(namespace, "timers", env).start()
    pid = app.proc.pid()
    wait_for(lambda: app.counters().get("timer_errors", 0) >= 6, 60, "the timers failing")
    ticks = app.counters()["timer_errors"]
    wait_for(lambda: app.counters()["timer_errors"] > ticks, 30, "the timers still ticking")
    assert app.proc.pid() == pid
    assert app.get("/ragwarm/health")["status"] == "ok"


# --- a moved host: fresh disk, same app id -------------------------------------------------


def test_a_fresh_disk_with_the_same_app_id_rebuilds_the_index_before_ready(
    kafka_producer, namespace, streams_factory, tmp_path
):
    """Before: the tables came back from their changelogs (version N), the consumer group
    resumed after every KB change, and the new disk's index stayed empty for good."""
    docs = list(initial_docs().values())
    send_docs(kafka_producer, namespace + KB_CHANGES, docs)
    # Without the index replica (one instance): re-indexed from kb.changes. With it, the
    # index is rebuilt from rag.chunks instead (tests/integration/test_replica.py).
    no_replica = {"RAGWARM_STREAMS_INDEX_REPLICA": "false"}
    first = streams_factory(namespace, "moved", no_replica).start()
    wait_for(lambda: first.counters().get("kb_events", 0) >= len(docs), 240, "indexing")
    before = first.get("/ragwarm/docs")["docs"]
    want = Client(first.url).prompt(QUESTION)[2]
    first.stop()

    fresh = tmp_path / "moved-host"
    env = {
        "RAGWARM_QDRANT_PATH": str(fresh / "qdrant"),
        "RAGWARM_STREAMS_DATA_DIR": str(fresh / "faust"),
        **no_replica,
    }
    second = streams_factory(namespace, "moved", env).start()
    print(f"\nready {wait_ready(second):.1f} s after the web views")
    got = Client(second.url).prompt(QUESTION)[2]
    assert [(r["chunk_id"], r["content_hash"]) for r in got] == [
        (r["chunk_id"], r["content_hash"]) for r in want
    ]
    assert second.get("/ragwarm/docs")["docs"] == before
    assert second.counters()["index_recovered"] == len(docs)


# --- a worker killed and restarted with the same id ----------------------------------------


def test_a_sigkilled_worker_restarted_with_its_id_gets_its_prefixes_again(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory
):
    """Before: the restarted worker's `ready` kept the old row's prefix list, so the app
    believed it still held everything and its ready-warmup sent nothing."""
    docs = list(initial_docs().values())
    send_docs(kafka_producer, namespace + KB_CHANGES, docs)
    env = {"RAGWARM_STREAMS_HOT_TOKENS": "false"}
    app = streams_factory(namespace, "restart", env).start()
    wait_for(lambda: app.counters().get("kb_events", 0) >= len(docs), 240, "indexing")
    worker_env = {"RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false"}
    first = worker_factory(
        "w1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace, env=worker_env
    ).start().wait_ready()

    query: QueryEvent = Client(app.url).query_event(QUESTION)
    prefix = query.prefix_hash
    kafka_producer.send(namespace + RAG_QUERIES, key=b"default", value=encode(query))
    kafka_producer.flush()
    events = Events(kafka_bootstrap, namespace + "worker.events")
    wait_for(lambda: events.find("stored", prefix), 120, "the tracked prefix stored on w1")

    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    t0 = time.time()
    second = worker_factory(
        "w1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace, env=worker_env
    ).start().wait_ready()
    try:
        wait_for(lambda: prefix in second.get("/v1/cache").text, 120, "the prefix re-warmed")
        print(f"\nre-warmed {time.time() - t0:.1f} s after the restart began")
        assert app.counters()["worker_restarts"] >= 1
    finally:
        second.stop()


# --- the broker comes up after the streams app ---------------------------------------------


def test_the_streams_app_waits_for_a_broker_started_40_s_later(tmp_path):
    """Before: creating the topics gave up after kafka-python's 30 s bootstrap timeout and
    the app ended with a traceback (a broker 20 s late was still caught by that timeout)."""
    shared = LocalKafka(HomeSettings(), KafkaSettings(bootstrap=None))
    shared.ensure_jars()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAGWARM_KAFKA_BOOTSTRAP"}
    env.update(
        RAGWARM_HOME=str(tmp_path / "home"),
        RAGWARM_KAFKA_PORT=str(port),
        RAGWARM_KAFKA_CONTROLLER_PORT=str(free_port()),
        RAGWARM_KAFKA_JARS_DIR=str(shared.jars_dir.parent),
    )
    app = StreamsApp(f"127.0.0.1:{port}", "late.", "late", tmp_path)
    app.proc.start()
    try:
        time.sleep(40)
        assert app.proc.pid() is not None, "the app gave up before the broker came"
        started = subprocess.run(
            [str(RAGWARM), "kafka", "start"], env=env, capture_output=True, text=True,
            timeout=180,
        )
        assert started.returncode == 0, started.stderr
        app.proc.wait_healthy(240)
        wait_ready(app)
        log = app.proc.log_file.read_text()
        assert "waiting for the Kafka broker" in log
        assert "Traceback" not in log
    finally:
        app.stop()
        subprocess.run([str(RAGWARM), "kafka", "stop"], env=env, timeout=120)


# --- the index directory unavailable for a while ---------------------------------------------


def test_an_update_during_a_store_outage_is_indexed_once_the_store_is_back(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, tmp_path
):
    """Before: the store's write error dead-lettered the KB change and acked it: the update
    was lost for good. The outage is another process holding the store's SQLite write lock
    (as root, permissions would not stop the writes, and since the store runs in WAL mode a
    moved directory does not either): every write of the app fails with 'database is
    locked' until the lock is released."""
    docs = list(initial_docs().values())[:1]
    send_docs(kafka_producer, namespace + KB_CHANGES, docs)
    app = streams_factory(namespace, "outage").start()
    wait_for(lambda: app.counters().get("kb_events", 0) >= 1, 240, "the first document")
    databases = sorted((tmp_path / "qdrant-outage").rglob("*.sqlite"))
    assert databases, "the local store keeps its points in SQLite"
    text = (
        "Outage runbook. The flux capacitor of the deployment pipeline needs 1.21 gigawatts "
        "before a sync wave may start; without it every sync stays pending."
    )
    update = KbChange(op="upsert", doc_id="outage.md", version=1, text=text)
    locks = [sqlite3.connect(db, timeout=60, isolation_level=None) for db in databases]
    try:
        for lock in locks:
            lock.execute("BEGIN EXCLUSIVE")
        send_docs(kafka_producer, namespace + KB_CHANGES, [update])
        wait_for(lambda: app.counters().get("retries", 0) >= 2, 120, "the write retried")
    finally:
        for lock in locks:
            lock.execute("ROLLBACK")
            lock.close()
    wait_for(lambda: app.counters().get("kb_events", 0) >= 2, 120, "the update indexed")
    counters = app.counters()
    assert counters.get("dead_letters", 0) == 0
    assert letters(kafka_bootstrap, namespace + DEADLETTER) == []
    rows = httpx.post(
        app.url + "/ragwarm/retrieve",
        json={"question": "How much power does the flux capacitor need?", "tenant": "default"},
        timeout=60,
    ).json()["chunks"]
    assert rows[0]["doc_id"] == "outage.md"


# --- re-driving dead letters ---------------------------------------------------------------


def _ragwarm(namespace: str, bootstrap: str, *args: str) -> str:
    env = {**os.environ, "RAGWARM_KAFKA_BOOTSTRAP": bootstrap,
           "RAGWARM_KAFKA_TOPIC_PREFIX": namespace}
    done = subprocess.run(
        [sys.executable, "-m", "ragwarm.cli", "deadletter", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_transient_failure_past_its_budget_is_parked_not_dead_lettered(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, tmp_path
):
    """Before (issue 41): with the retry budget spent the outage dead-lettered the update
    and acked it (lost until someone redrove it). Now it is parked: retried until the
    store is back, the parked gauge up meanwhile, and never dead-lettered."""
    env = {"RAGWARM_STREAMS_RETRY_ATTEMPTS": "0", "RAGWARM_STREAMS_RETRY_MAX_S": "1.0"}
    app = streams_factory(namespace, "parked", env).start()
    wait_ready(app)
    store = tmp_path / "qdrant-parked"
    away = store.with_name("qdrant-parked.away")
    update = KbChange(op="upsert", doc_id="runbook.md", version=1,
                      text="Runbook. Rotate the signing keys of the gateway every ninety days.")
    store.rename(away)
    try:
        send_docs(kafka_producer, namespace + KB_CHANGES, [update])
        wait_for(lambda: app.counters().get("parked_records", 0) >= 1, 120, "the update parked")
        time.sleep(3)  # parked: retried every second, still not dead-lettered
        assert app.counters().get("dead_letters", 0) == 0
        metrics = httpx.get(app.url + "/metrics", timeout=10).text
        assert "ragwarm_streams_parked_records 1.0" in metrics
    finally:
        away.rename(store)
    wait_for(lambda: app.counters().get("kb_events", 0) >= 1, 120, "the parked update applied")
    counters = app.counters()
    assert counters.get("parked_records", 0) == 0 and counters.get("dead_letters", 0) == 0
    assert app.get("/ragwarm/docs")["docs"]["runbook.md"]["version"] == 1
    assert letters(kafka_bootstrap, namespace + DEADLETTER) == []


def test_redrive_sends_allowed_letters_once(kafka_bootstrap, kafka_producer, namespace):
    """Before (issue 41): redrive sent a letter to whatever topic it named, with the
    operator's credentials, and every redrive sent every letter again."""
    from schemas.deadletter import Origin, dead_letter

    change = KbChange(op="upsert", doc_id="r.md", version=1, text="Redriven once.")
    ours = dead_letter(Origin(namespace + KB_CHANGES, 0, 5, b"r.md", encode(change)),
                       "a letter to send again", None, 1 << 20)
    crafted = dead_letter(Origin(namespace + "payments.ledger", 0, 1, b"k", b"pay me"),
                          "crafted", None, 1 << 20)
    for letter in (ours, crafted):
        kafka_producer.send(namespace + DEADLETTER, key=b"k", value=encode(letter))
    kafka_producer.flush()
    dry = _ragwarm(namespace, kafka_bootstrap, "redrive", "--dry-run")
    assert "refused: topic " + repr(namespace + "payments.ledger") in dry
    assert "dry run: 1 of 2 letters would be sent" in dry
    assert "sent 1 of 2" in _ragwarm(namespace, kafka_bootstrap, "redrive")
    again = _ragwarm(namespace, kafka_bootstrap, "redrive")
    assert "sent 0 of 2" in again and "already redriven" in again
    sent = read_topic(kafka_bootstrap, namespace + KB_CHANGES)
    assert [decode(r.value, KbChange) for r in sent] == [change]
    assert "(redriven " in _ragwarm(namespace, kafka_bootstrap, "list")
