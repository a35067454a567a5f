"""Issue 18 end to end: real Kafka, the streams app, a worker process with chunk reuse on,
Qdrant local mode, SmolLM2. An edit to a hot document makes the app send the new chunk's
KV prefill; the worker holds it and blends it into a prompt no cached prefix covers; the
version it replaced is dropped and never reused."""

from __future__ import annotations

import pytest

from schemas import ChunkRef, KbChange, WarmupCommand, decode, encode
from schemas.topics import KB_CHANGES, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS
from tests.integration.e2e_kit import QUESTION, Chunk, Client, Events, initial_docs
from tests.integration.kb_stack import send_docs
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

# A chunk no prompt of the app holds, sorting before every `docs/` chunk: placed first, it
# keeps any cached prefix from covering the edited chunk after it.
BEFORE = {"chunk_id": "aaa-notes.md#0", "content_hash": "0" * 64, "doc_id": "aaa-notes.md",
          "text": "Release notes are kept per minor version and list every breaking change."}


def edit(doc: KbChange, chunk_text: str, n: int) -> KbChange:
    """Version n of `doc`, changed inside the chunk with `chunk_text`."""
    line = next(ln for ln in chunk_text.splitlines() if len(ln) > 30 and ln in doc.text)
    text = doc.text.replace(line, line + f" Edit number {n} added this sentence.", 1)
    return KbChange(op="upsert", doc_id=doc.doc_id, version=doc.version + 1000 * n, text=text)


def held_refs(worker) -> set[tuple[str, str]]:
    items = worker.get("/v1/cache").json()["items"]
    return {(r["chunk_id"], r["content_hash"]) for i in items for r in i["chunk_refs"]}


def test_an_edit_to_a_hot_document_warms_its_new_chunk_and_drops_the_old_one(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory
):
    docs = initial_docs()
    send_docs(kafka_producer, namespace + KB_CHANGES, list(docs.values()))
    app = streams_factory(namespace, "chunkwarm", {
        "RAGWARM_STREAMS_HOT_MIN_COUNT": "2", "RAGWARM_STREAMS_CHUNK_WARMUP": "true",
    }).start()
    worker = worker_factory("w1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace, env={
        "RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false",
        "RAGWARM_WORKER_CHUNK_REUSE": "true", "RAGWARM_WORKER_CHUNK_BLEND_GATE": "false",
    })
    worker.start().wait_ready()
    try:
        run_scenario(kafka_bootstrap, kafka_producer, namespace, app, worker, docs)
    finally:
        worker.stop()


def run_scenario(bootstrap, producer, namespace, app, worker, docs) -> None:
    wait_for(lambda: app.counters().get("kb_events", 0) >= len(docs), 240, "initial docs")
    wait_for(lambda: any(w["ready"] for w in app.get("/ragwarm/workers")["workers"]), 60,
             "the worker in the worker table")
    client = Client(app.url)
    events = Events(bootstrap, namespace + WORKER_EVENTS)
    query = client.query_event(QUESTION)
    for _ in range(3):  # the question becomes hot: its documents are hot
        producer.send(namespace + RAG_QUERIES, key=b"default", value=encode(query))
    producer.flush()
    wait_for(lambda: events.find("stored", query.prefix_hash), 120, "the hot prefix stored")

    _, _, rows = client.prompt(QUESTION)
    target = next(r for r in rows if r["doc_id"] in docs)
    doc = docs[target["doc_id"]]
    commands = Events(bootstrap, namespace + WARMUP_COMMANDS,
                      parse=lambda v: decode(v, WarmupCommand))
    versions: list[str] = []
    for n in (1, 2):
        change = edit(doc, target["text"], n)
        producer.send(namespace + KB_CHANGES, key=change.doc_id.encode(), value=encode(change))
        producer.flush()
        try:
            versions.append(check_warmed(client, worker, commands, target, versions, n))
        except AssertionError as exc:  # what the app decided says which step was skipped
            raise AssertionError(f"{exc}; app counters: {app.counters()}") from exc
    # Edit 2 replaced edit 1's chunk: the app invalidated it and the worker dropped its KV.
    old_ref = ChunkRef(chunk_id=target["chunk_id"], content_hash=versions[0])
    assert [c for _, c in commands.poll() if c.op == "invalidate" and old_ref in c.chunk_refs]
    wait_for(lambda: (old_ref.chunk_id, old_ref.content_hash) not in held_refs(worker), 60,
             "edit 1's chunk KV dropped")
    assert app.counters()["chunk_prefills"] >= 2
    check_blending(client, worker, target["chunk_id"], versions)
    commands.consumer.close()
    events.consumer.close()


def check_warmed(client: Client, worker, commands: Events, target: dict, versions: list[str],
                 n: int) -> str:
    """Edit n was indexed, the app sent its chunk's prefill, the worker holds that chunk's
    KV; returns the chunk's new content hash."""
    seen = [target["content_hash"], *versions]
    new = wait_for(lambda: _new_version(client, target["chunk_id"], seen), 120,
                   f"edit {n} indexed")
    ref = ChunkRef(chunk_id=target["chunk_id"], content_hash=new)
    wait_for(lambda: [c for _, c in commands.poll()
                      if c.op == "prefill_chunk" and c.chunk_refs == [ref]],
             60, f"the app's chunk prefill of edit {n}")
    wait_for(lambda: (ref.chunk_id, ref.content_hash) in held_refs(worker), 120,
             f"the worker holding edit {n}'s chunk KV")
    return new


def check_blending(client: Client, worker, chunk_id: str, versions: list[str]) -> None:
    """A prompt no cached prefix covers (the edited chunk after another document's chunk)
    blends the held current chunk; the same prompt with the replaced version blends none."""
    edited_row = next(r for r in client.prompt(QUESTION)[2] if r["chunk_id"] == chunk_id)
    assert edited_row["content_hash"] == versions[-1]
    current = _answer(client, worker, [BEFORE, edited_row])
    assert current["blended_tokens"] > 0, current
    stale_row = {**edited_row, "content_hash": versions[0],
                 "text": edited_row["text"].replace("Edit number 2", "Edit number 1")}
    stale = _answer(client, worker, [BEFORE, stale_row])
    # A changed chunk is never reused from its first changed token on: chunk KV is keyed by
    # token ids, so only its leading unchanged tokens' (exact) KV can match.
    old, new = (_prompt(client, [BEFORE, r]) for r in (stale_row, edited_row))
    (a, b) = old.chunk_spans[1]
    unchanged = next(i for i in range(a, b) if old.token_ids[i] != new.token_ids[i]) - a
    assert stale["blended_tokens"] <= unchanged, (stale, unchanged)


def _prompt(client: Client, rows: list[dict]):
    return client.prompts.build([Chunk(r) for r in rows], "What changed?")


def _answer(client: Client, worker, rows: list[dict]) -> dict:
    prompt = _prompt(client, rows)
    spans = [{"chunk_id": ref.chunk_id, "content_hash": ref.content_hash, "start": a, "end": b}
             for ref, (a, b) in zip(prompt.chunk_refs, prompt.chunk_spans, strict=True)]
    body = worker.post("/v1/completions", {
        "prompt": list(prompt.token_ids), "max_tokens": 1, "temperature": 0,
        "chunk_spans": spans,
    }).json()
    return body["usage"]["prompt_tokens_details"]


def _new_version(client: Client, chunk_id: str, seen: list[str]) -> str | None:
    """The chunk's current content hash once it is none of `seen`."""
    rows = client.prompt(QUESTION)[2]
    now = next((r["content_hash"] for r in rows if r["chunk_id"] == chunk_id), None)
    return now if now not in seen else None
