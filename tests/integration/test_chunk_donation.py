"""Issue 38 end to end: a worker process (real SmolLM2, real Kafka) donates the chunks of every
prompt it caches. A question never asked, whose three chunks were computed in other prompts,
is blended from them; after one chunk changes (an invalidation on `warmup.commands`), that
chunk is never blended again, even where a prompt still holds its old tokens. A blended
answer's prompt is stored, and a later ask reads it (`approx_cached_tokens`)."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kafka import KafkaProducer

from schemas import ChunkRef, WarmupCommand, encode
from schemas.topics import WARMUP_COMMANDS
from tests.integration.worker_proc import WorkerProc

pytestmark = pytest.mark.integration

TENANT = "donate"
OPENING = "<|im_start|>system\nAnswer from the context.\n\nContext:\n"
TEXTS = {
    "a#0": "\n[a#0]\nArgo CD is a declarative, GitOps continuous delivery tool for Kubernetes. "
    "It watches Git repositories and compares the desired state with the live state.\n",
    "b#0": "\n[b#0]\nApplications are defined as Kubernetes manifests kept in a Git repository, "
    "as Helm charts, Kustomize applications or plain YAML directories.\n",
    "c#0": "\n[c#0]\nA sync operation applies the desired state from Git to the live cluster, "
    "and the application becomes Synced when both agree.\n",
    # Fillers: each chunk above is computed after one of them, never after the opening.
    "x#0": "\n[x#0]\nProjects group applications and restrict where they may deploy.\n",
    "y#0": "\n[y#0]\nThe API server exposes a gRPC and REST interface used by the web UI.\n",
    "z#0": "\n[z#0]\nNotifications can be sent to Slack when an application degrades.\n",
}


def question(text: str) -> str:
    return f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref(chunk_id: str) -> dict[str, str]:
    digest = hashlib.sha256(TEXTS[chunk_id].encode()).hexdigest()
    return {"chunk_id": chunk_id, "content_hash": digest}


@pytest.fixture
def worker(worker_factory: Callable[..., WorkerProc], kafka_bootstrap: str,
           namespace: str) -> Iterator[WorkerProc]:
    proc = worker_factory(f"w-{uuid.uuid4().hex[:8]}", kafka_bootstrap=kafka_bootstrap,
                          topic_prefix=namespace, env={
                              "RAGWARM_WORKER_HEARTBEAT_S": "1",
                              "RAGWARM_WORKER_CACHE_REQUESTS": "true",
                              "RAGWARM_WORKER_CHUNK_REUSE": "true",
                              # Forced on: this checks donation, not the cost estimate.
                              "RAGWARM_WORKER_CHUNK_BLEND_GATE": "false",
                          })
    yield proc.start().wait_ready()
    proc.stop()


def ask(worker: WorkerProc, tokenizer, chunk_ids: list[str], text: str,
        tenant: str = TENANT) -> dict:
    """One completion of the canonical prompt of `chunk_ids` and a question; its usage."""
    def ids(s: str) -> list[int]:
        return list(tokenizer(s, add_special_tokens=False)["input_ids"])

    prompt, spans = ids(OPENING), []
    for chunk_id in chunk_ids:
        tokens = ids(TEXTS[chunk_id])
        spans.append({**ref(chunk_id), "start": len(prompt), "end": len(prompt) + len(tokens)})
        prompt += tokens
    prompt += ids(question(text))
    response = worker.post("/v1/completions", {
        "prompt": prompt, "max_tokens": 1, "temperature": 0, "tenant": tenant,
        "chunk_refs": [ref(c) for c in chunk_ids], "chunk_spans": spans,
    })
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    details = usage["prompt_tokens_details"]
    return {"blended": details["blended_tokens"], "cached": details["cached_tokens"],
            "approx_cached": details["approx_cached_tokens"],
            "chunks": {s["chunk_id"]: s["end"] - s["start"] for s in spans},
            "starts": {s["chunk_id"]: s["start"] for s in spans}}


def held_chunk_ids(worker: WorkerProc) -> set[str]:
    items = worker.get("/v1/cache").json()["items"]
    return {r["chunk_id"] for item in items for r in item["chunk_refs"]}


def test_a_first_ask_blends_chunks_other_prompts_computed_until_one_changes(
    worker: WorkerProc, tokenizer, kafka_producer: KafkaProducer, namespace: str,
) -> None:
    # Three other prompts, each computing one of the chunks after a filler; each is cached.
    for filler, chunk_id, text in (("x#0", "a#0", "What is Argo CD?"),
                                   ("y#0", "b#0", "Where are applications defined?"),
                                   ("z#0", "c#0", "What is a sync?")):
        assert ask(worker, tokenizer, [filler, chunk_id], text)["blended"] == 0
    assert {"a#0", "b#0", "c#0"} <= held_chunk_ids(worker)

    # Never asked, its chunks in another order: no cached prefix covers any of them.
    first = ask(worker, tokenizer, ["c#0", "a#0", "b#0"], "How does Argo CD deploy?")
    assert first["blended"] == sum(first["chunks"].values()) > 0
    # The blended answer's prompt was stored: asked again, it reads the blend's KV.
    second = ask(worker, tokenizer, ["c#0", "a#0", "b#0"], "How does Argo CD deploy?")
    assert second["blended"] == 0 and second["approx_cached"] == second["cached"] > 0

    # b changes: the app invalidates its ref on every worker (Kafka, as deployed).
    command = WarmupCommand(command_id=f"c-{uuid.uuid4().hex[:8]}", op="invalidate",
                            tenant=TENANT, chunk_refs=[ChunkRef(**ref("b#0"))])
    kafka_producer.send(namespace + WARMUP_COMMANDS, key=b"0" * 32, value=encode(command))
    kafka_producer.flush()
    deadline = time.monotonic() + 90
    while "b#0" in held_chunk_ids(worker):
        assert time.monotonic() < deadline, "the invalidation never reached the worker"
        time.sleep(0.5)

    # The same prompt (b's old tokens, the old ref) and another never asked: b not blended.
    # The stored blend was cut where b starts: its head still serves, and what a and c have
    # past it is blended.
    for order, text in ((["c#0", "a#0", "b#0"], "How does Argo CD deploy?"),
                        (["b#0", "c#0", "a#0"], "What does Argo CD compare?")):
        again = ask(worker, tokenizer, order, text)
        cached, starts, sizes = again["cached"], again["starts"], again["chunks"]
        assert cached <= starts["b#0"], order
        past_cached = sum(max(0, starts[c] + sizes[c] - max(starts[c], cached))
                          for c in ("a#0", "c#0"))
        assert again["blended"] == past_cached, order


def warm(kafka_producer: KafkaProducer, namespace: str, tokenizer, tenant: str,
         chunk_ids: list[str], *, with_spans: bool) -> None:
    """A warmup `prefill` on `warmup.commands` of the canonical prefix of `chunk_ids`, as the
    streams app sends it: with where each chunk stands (v5) or, as before, without."""
    def ids(s: str) -> list[int]:
        return list(tokenizer(s, add_special_tokens=False)["input_ids"])

    prefix, spans = ids(OPENING), []
    for chunk_id in chunk_ids:
        tokens = ids(TEXTS[chunk_id])
        spans.append({**ref(chunk_id), "start": len(prefix), "end": len(prefix) + len(tokens)})
        prefix += tokens
    prefix += ids("<|im_end|>\n<|im_start|>user\n")
    command = WarmupCommand(
        command_id=f"c-{uuid.uuid4().hex[:8]}", op="prefill", tenant=tenant, token_ids=prefix,
        chunk_refs=[ChunkRef(**ref(c)) for c in chunk_ids],
        chunk_spans=spans if with_spans else [], pin=True, reason="test warmup",
    )
    kafka_producer.send(namespace + WARMUP_COMMANDS, key=b"1" * 32, value=encode(command))


def held_in(worker: WorkerProc, tenant: str) -> int:
    items = worker.get("/v1/cache").json()["items"]
    return sum(item.get("tenant") == tenant for item in items)


def test_a_first_ask_blends_chunks_only_warmups_computed_when_they_carried_their_places(
    worker: WorkerProc, tokenizer, kafka_producer: KafkaProducer, namespace: str,
) -> None:
    # The same three warm prefixes (each chunk after a filler) in two tenants: with the
    # chunks' places on the command, and without (a v4-style prefill). No request hits them.
    pairs = (("x#0", "a#0"), ("y#0", "b#0"), ("z#0", "c#0"))
    for tenant, with_spans in ((TENANT, True), (TENANT + "-nospans", False)):
        for filler, chunk_id in pairs:
            warm(kafka_producer, namespace, tokenizer, tenant, [filler, chunk_id],
                 with_spans=with_spans)
    kafka_producer.flush()
    deadline = time.monotonic() + 120
    while held_in(worker, TENANT) < 3 or held_in(worker, TENANT + "-nospans") < 3:
        assert time.monotonic() < deadline, "the warmups never reached the worker"
        time.sleep(0.5)

    # Never asked, no cached prefix covers its chunks: only donated chunk KV can serve them.
    order, text = ["c#0", "a#0", "b#0"], "How does Argo CD deploy?"
    first = ask(worker, tokenizer, order, text, tenant=TENANT)
    assert 0 < first["blended"] <= sum(first["chunks"].values())
    assert ask(worker, tokenizer, order, text, tenant=TENANT + "-nospans")["blended"] == 0
