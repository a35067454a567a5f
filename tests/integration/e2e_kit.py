"""What the end-to-end tests share: the Argo CD documents and question they use, a client
that builds canonical prompts as the streams app does, a reader of worker events, and the
scenario of issue 5 (a hot prefix warmed, invalidated by an edit, re-warmed, its TTL extended
by an identical re-ingest), which the plain and the secured stacks both run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from rag.prompt import PromptBuilder
from rag.settings import RagSettings
from ragwarm.models import llm_dir, load_tokenizer
from ragwarm.settings import ModelSettings
from schemas import KbChange, QueryEvent, WarmupCommand, WorkerEvent, decode, encode
from schemas.topics import KB_CHANGES, RAG_QUERIES, WARMUP_COMMANDS, WORKER_EVENTS
from streams.decide.records import PrefixOp
from streams.shell.topics import PREFIX_OPS
from tests.integration.kafka_read import subscriber
from tests.integration.kb_stack import EVENTS
from tests.integration.waiting import wait_for
from workers.kv.blocks import block_hashes

QUESTION = "Can I retrigger the checks without pushing a new commit?"
DOCS = ["docs/developer-guide/ci.md", "docs/SUPPORT.md", "docs/faq.md", "docs/CONTRIBUTING.md"]


class Chunk:
    def __init__(self, row: dict):
        self.chunk_id = row["chunk_id"]
        self.content_hash = row["content_hash"]
        self.text = row["text"]


class Client:
    """What a RAG app does, spelled out: retrieve, canonical prompt, prefix hashes."""

    def __init__(self, streams_url: str, api_key: str | None = None):
        self.url = streams_url
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.prompts = PromptBuilder(load_tokenizer(llm_dir()), RagSettings().system_prompt)
        self.model = ModelSettings().llm_name

    def prompt(self, question: str):
        rows = httpx.post(
            f"{self.url}/ragwarm/retrieve",
            json={"question": question, "tenant": "default"},
            headers=self.headers,
            timeout=60,
        ).json()["chunks"]
        prompt = self.prompts.build([Chunk(r) for r in rows], question)
        hashes = block_hashes(prompt.prefix_ids, tenant="default", model=self.model)
        return prompt, hashes, rows

    def query_event(self, question: str) -> QueryEvent:
        prompt, hashes, _ = self.prompt(question)
        return QueryEvent(
            question=question,
            chunk_refs=list(prompt.chunk_refs),
            prefix_hash=hashes[-1],
            block_hashes=hashes,
            prefix_tokens=prompt.prefix_len,
            prompt_tokens=len(prompt.token_ids),
        )


def initial_docs() -> dict[str, KbChange]:
    found = {}
    with EVENTS.open() as f:
        for line in f:
            e = json.loads(line)
            if e["initial"] and e["doc_id"] in DOCS:
                found[e["doc_id"]] = KbChange(
                    op="upsert", doc_id=e["doc_id"], version=e["seq"], text=e["text"]
                )
    return found


def edited(doc: KbChange, chunk_text: str) -> KbChange:
    """A new version of `doc` whose change falls inside the chunk with `chunk_text`."""
    line = next(ln for ln in chunk_text.splitlines() if len(ln) > 30 and ln in doc.text)
    text = doc.text.replace(line, line + " This sentence was added by an edit.", 1)
    return KbChange(op="upsert", doc_id=doc.doc_id, version=doc.version + 1000, text=text)


class Events:
    """Reads `worker.events` of the namespace from the start (or another topic, `parse`d)."""

    def __init__(self, bootstrap: str, topic: str, options: dict | None = None,
                 parse: Callable[[bytes], Any] = lambda v: decode(v, WorkerEvent)):  # fmt: skip
        self.consumer = subscriber(bootstrap, topic, consumer_timeout_ms=500, **(options or {}))
        self.parse = parse
        self.seen: list[tuple[float, Any]] = []

    def poll(self) -> list[tuple[float, Any]]:
        for message in self.consumer:
            self.seen.append((time.time(), self.parse(message.value)))
        return self.seen

    def find(self, kind: str, prefix_hash: str | None = None, after: float = 0.0):
        return [
            (t, e)
            for t, e in self.poll()
            if e.kind == kind
            and t >= after
            and (prefix_hash is None or e.prefix_hash == prefix_hash)
        ]


def check_rewarm(app, bootstrap: str, namespace: str, options, new: str) -> None:
    """The edit re-warmed the new prefix. Two paths warm it, both by design: the
    invalidation re-warms the old prefix's questions (a "re-prefill after ..." op), and
    the hot planner re-warms the hot question, whose prefix no worker holds any more.
    Whichever op comes first sends the prefill; the other finds it in flight (or held)
    and sends none, so which one did is a race. What holds either way: the invalidation
    asked for the new prefix, a prefill of it was sent by one of the two, and when it was
    the re-prefill, the app counted it."""
    ops = Events(bootstrap, namespace + PREFIX_OPS, options, PrefixOp.model_validate_json)
    wait_for(
        lambda: [o for _, o in ops.poll() if o.op == "warm" and o.prefix_hash == new
                 and o.reason.startswith("re-prefill after")],
        60, "the invalidation's re-prefill op of the new prefix",
    )  # fmt: skip
    commands = Events(bootstrap, namespace + WARMUP_COMMANDS, options,
                      lambda v: decode(v, WarmupCommand))  # fmt: skip
    prefills = wait_for(
        lambda: [c for _, c in commands.poll() if c.op == "prefill" and c.prefix_hash == new],
        60, "the prefill of the new prefix",
    )  # fmt: skip
    ops.consumer.close()
    commands.consumer.close()
    first = prefills[0].reason
    print(f"the new prefix was prefilled for: {first}")
    assert first.startswith("re-prefill after") or first == "hot", first
    if first.startswith("re-prefill after"):
        assert app.counters()["re_prefills"] >= 1


def run_scenario(kafka_bootstrap, kafka_producer, namespace, app, worker, docs, options=None):
    events = Events(kafka_bootstrap, namespace + WORKER_EVENTS, options)
    wait_for(lambda: app.counters().get("kb_events", 0) >= len(docs), 240, "initial docs")
    wait_for(
        lambda: any(w["ready"] for w in app.get("/ragwarm/workers")["workers"]),
        60,
        "the worker in the worker table",
    )

    # The question becomes hot: its prefix is prefilled on the worker through Kafka.
    client = Client(app.url)
    query = client.query_event(QUESTION)
    for _ in range(3):
        kafka_producer.send(namespace + RAG_QUERIES, key=b"default", value=encode(query))
    kafka_producer.flush()
    old = query.prefix_hash
    wait_for(lambda: events.find("stored", old), 120, "the hot prefix stored on the worker")
    assert app.get(f"/ragwarm/prefixes/{old}")["holders"] == ["w1"]

    # Edit the answer document inside a chunk the warm prefix depends on.
    _, _, rows = client.prompt(QUESTION)
    target = next(r for r in rows if r["doc_id"] in docs)
    change = edited(docs[target["doc_id"]], target["text"])
    t0 = time.time()
    kafka_producer.send(namespace + KB_CHANGES, key=change.doc_id.encode(), value=encode(change))
    kafka_producer.flush()
    invalidated = wait_for(
        lambda: events.find("invalidated", old, after=t0), 60, "the old prefix invalidated"
    )
    new_query = client.query_event(QUESTION)
    new = new_query.prefix_hash
    assert new != old
    stored = wait_for(lambda: events.find("stored", new, after=t0), 60, "the new prefix warm")
    print(
        f"\nevent-to-invalidate {invalidated[0][0] - t0:.2f} s, "
        f"event-to-warm {stored[0][0] - t0:.2f} s"
    )
    assert app.counters()["invalidations"] >= 1
    check_rewarm(app, kafka_bootstrap, namespace, options, new)
    assert old not in worker.get("/v1/cache").text

    # The next query for that question hits the new prefix, built from the new text.
    prompt, hashes, rows = client.prompt(QUESTION)
    assert hashes[-1] == new
    assert any(
        r["content_hash"] != target["content_hash"] and r["chunk_id"] == target["chunk_id"]
        for r in rows
    )
    body = worker.post(
        "/v1/completions", {"prompt": list(prompt.token_ids), "max_tokens": 4, "temperature": 0}
    ).json()
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(hashes) * 16

    # Re-ingesting identical content extends the TTL and prefills nothing.
    prefills = app.counters()["prefills"]
    t1 = time.time()
    same = change.model_copy(update={"version": change.version + 1})
    kafka_producer.send(namespace + KB_CHANGES, key=same.doc_id.encode(), value=encode(same))
    kafka_producer.flush()
    wait_for(lambda: events.find("ttl_extended", new, after=t1), 60, "the TTL extended")
    time.sleep(2)
    assert app.counters()["prefills"] == prefills
    assert not [e for _, e in events.find("stored", after=t1)]
