"""Issue 16, synthetic warmup end to end: real Kafka, the streams app, a worker process with
SmolLM2, Qdrant local mode. A document that has just changed gets questions sampled by the
worker's model; their top-3 prefixes are warmed on that worker; a first ask of one of those
questions starts warm and is counted as a hit on a synthetic prefix."""

from __future__ import annotations

import pytest

from schemas import KbChange, WarmupCommand, decode, encode
from schemas.topics import KB_CHANGES, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS
from tests.integration.e2e_kit import Client, Events, initial_docs
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

DOC = "docs/developer-guide/ci.md"


def test_a_changed_document_leads_to_synthetic_prefixes_on_the_worker(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory
):
    app = streams_factory(namespace, "synth", {
        "RAGWARM_STREAMS_SYNTHETIC": "true",
        "RAGWARM_STREAMS_SYNTHETIC_SEED": "7",
        "RAGWARM_STREAMS_SYNTHETIC_QUESTIONS": "2",
        "RAGWARM_STREAMS_SYNTHETIC_MAX_NEW_TOKENS": "16",
        "RAGWARM_STREAMS_SYNTHETIC_SOURCE_TOKENS": "96",
    }).start()
    worker = worker_factory(
        "w1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace,
        env={"RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false"},
    )
    worker.start().wait_ready()
    try:
        run_scenario(kafka_bootstrap, kafka_producer, namespace, app, worker)
    finally:
        worker.stop()  # before the namespace's topics are deleted


def run_scenario(kafka_bootstrap, kafka_producer, namespace, app, worker) -> None:
    wait_for(lambda: any(w["ready"] for w in app.get("/ragwarm/workers")["workers"]), 60,
             "the worker in the worker table")
    doc: KbChange = initial_docs()[DOC]
    kafka_producer.send(namespace + KB_CHANGES, key=doc.doc_id.encode(), value=encode(doc))
    kafka_producer.flush()
    commands = Events(kafka_bootstrap, namespace + WARMUP_COMMANDS,
                      parse=lambda v: decode(v, WarmupCommand))
    synth, *_ = wait_for(lambda: [c for _, c in commands.poll() if c.op == "synthesize"], 240,
                       "a synthesize command for the new document")
    assert synth.worker_id == "w1" and 1.2 <= (synth.temperature or 0) <= 1.5
    assert {r.doc_id for r in synth.chunk_refs} == {DOC}

    events = Events(kafka_bootstrap, namespace + WORKER_EVENTS)
    [(_, answer)] = wait_for(lambda: events.find("synthesized"), 240, "the worker's questions")
    print(f"\nsynthetic questions: {answer.questions}")
    assert answer.command_id == synth.command_id and answer.questions
    wait_for(lambda: app.counters().get("synthetic_prefixes_warmed", 0) >= 1, 120,
             "a synthetic prefix warm op")
    prefills = wait_for(lambda: [c for _, c in commands.poll() if c.op == "prefill"
                                 and c.reason == "synthetic question"], 120,
                        "the prefill of a synthetic prefix")
    warmed = {c.prefix_hash for c in prefills}
    stored = wait_for(lambda: [e for _, e in events.find("stored") if e.prefix_hash in warmed],
                      120, "a synthetic prefix stored on the worker")
    held = stored[0].prefix_hash
    state = app.get(f"/ragwarm/prefixes/{held}")
    assert state["holders"] == ["w1"]
    mem_total = app.get("/ragwarm/workers")["workers"][0]["mem_total"]
    assert sum(e.bytes for e in stored) <= 0.05 * mem_total

    # A first ask of a question whose top-3 is a synthetic prefix starts warm and counts.
    client = Client(app.url)
    question = next(q for q in answer.questions if client.query_event(q).prefix_hash == held)
    prompt, hashes, _ = client.prompt(question)
    body = worker.post("/v1/completions",
                       {"prompt": list(prompt.token_ids), "max_tokens": 1, "temperature": 0})
    cached = body.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(hashes) * 16
    asked = client.query_event(question).model_copy(update={"cached_tokens": cached})
    kafka_producer.send(namespace + RAG_QUERIES, key=b"default", value=encode(asked))
    kafka_producer.flush()
    wait_for(lambda: app.counters().get("synthetic_first_hits", 0) >= 1, 60,
             "the first ask counted as a synthetic hit")
    assert app.counters()["first_asks"] >= 1
    commands.consumer.close()
    events.consumer.close()


