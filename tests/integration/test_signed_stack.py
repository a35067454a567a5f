"""The streams app and a worker signing on the real broker (issue 41, items 4 and 5): the app
holds the master secret, the worker only its own events key and the commands key (what
`ragwarm keys` prints). The worker joins the table on signed events and a hot prefix is
prefilled by a signed command; an unsigned forged worker event and an unsigned warmup command
are refused and counted. (test_streams_e2e's whole scenario ran signed here too, but its
last check, no `stored` after an identical re-ingest, fails on 595a69d as well.)"""

from __future__ import annotations

import pytest

from schemas import ChunkRef, KbChange, WarmupCommand, WorkerEvent, encode
from schemas.signing import derive_commands_key, derive_worker_key
from schemas.topics import KB_CHANGES, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS
from tests.integration.e2e_kit import QUESTION, Client, Events, initial_docs
from tests.integration.kb_stack import send_docs
from tests.integration.waiting import wait_for
from tests.integration.worker_proc import labelled

pytestmark = pytest.mark.integration

MASTER = b"e2e-signing-master"
REFUSED = "ragwarm_worker_commands_refused_total"


def test_a_signed_stack_runs_and_refuses_what_is_not_signed(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory
):
    docs: dict[str, KbChange] = initial_docs()
    send_docs(kafka_producer, namespace + KB_CHANGES, list(docs.values()))
    app = streams_factory(namespace, "signed", {
        "RAGWARM_STREAMS_HOT_MIN_COUNT": "2",
        "RAGWARM_STREAMS_WORKER_EVENTS_SECRET": MASTER.decode(),
    }).start()  # fmt: skip
    worker = worker_factory("w1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace, env={
        "RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false",
        "RAGWARM_WORKER_EVENTS_SECRET": derive_worker_key(MASTER, "w1"),
        "RAGWARM_WORKER_COMMANDS_KEY": derive_commands_key(MASTER),
    })  # fmt: skip
    worker.start().wait_ready()
    try:
        events = Events(kafka_bootstrap, namespace + WORKER_EVENTS)
        wait_for(lambda: app.counters().get("kb_events", 0) >= len(docs), 240, "initial docs")
        wait_for(lambda: any(w["ready"] for w in app.get("/ragwarm/workers")["workers"]), 60,
                 "the worker in the worker table, on its signed events")  # fmt: skip
        query = Client(app.url).query_event(QUESTION)
        for _ in range(3):  # hot: its prefix is prefilled on the worker by a signed command
            kafka_producer.send(namespace + RAG_QUERIES, key=b"default", value=encode(query))
        kafka_producer.flush()
        wait_for(lambda: events.find("stored", query.prefix_hash), 120, "the hot prefix stored")
        assert app.get(f"/ragwarm/prefixes/{query.prefix_hash}")["holders"] == ["w1"]
        assert app.counters().get("unauthenticated_events", 0) == 0
        metrics = worker.get("/metrics").text
        assert labelled(metrics, REFUSED, 'reason="unsigned"') == 0
        assert labelled(metrics, REFUSED, 'reason="bad_signature"') == 0

        # A forger on worker.events names itself w1 at its own URL; one on warmup.commands
        # tells w1 to drop what it holds.
        forged = WorkerEvent(worker_id="w1", kind="heartbeat", url="http://evil:8000")
        kafka_producer.send(namespace + WORKER_EVENTS, key=b"w1", value=encode(forged))
        ref = ChunkRef(chunk_id="d.md#0", content_hash="0" * 64)
        command = WarmupCommand(command_id="forged-1", op="invalidate", chunk_refs=[ref])
        kafka_producer.send(namespace + WARMUP_COMMANDS, key=b"", value=encode(command))
        kafka_producer.flush()
        wait_for(lambda: app.counters().get("unauthenticated_events", 0) >= 1, 60,
                 "the forged event counted")  # fmt: skip
        wait_for(lambda: labelled(worker.get("/metrics").text, REFUSED, 'reason="unsigned"')
                 >= 1, 60, "the forged command counted")  # fmt: skip
        urls = {w["worker_id"]: w["url"] for w in app.get("/ragwarm/workers")["workers"]}
        assert urls["w1"] == worker.url
    finally:
        worker.stop()
