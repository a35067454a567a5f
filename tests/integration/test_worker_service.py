"""A real `ragwarm worker` process: readiness, Kafka commands and events, HTTP API, auth."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
from kafka import KafkaProducer

from ragwarm.settings import KafkaSettings, ModelSettings
from schemas import ChunkRef, WarmupCommand, encode
from schemas.topics import WARMUP_COMMANDS, WORKER_EVENTS, prefixed
from tests.integration.kafka_read import WorkerEvents
from tests.integration.worker_proc import WorkerProc, completion, metric
from workers.kv.blocks import block_hashes

pytestmark = pytest.mark.integration

API_KEY = "test-secret"
WARM_TENANT = "warm"
WARM_TEXTS = [
    " ".join(f"Section {i}.{j}: the river keeps the mill turning in season {j}." for j in range(12))
    for i in range(3)
]


def tokens(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prefix_hash(ids: list[int], tenant: str) -> str:
    return block_hashes(ids, tenant=tenant, model=ModelSettings().llm_name)[-1]


@pytest.fixture(scope="module")
def namespace(kafka_bootstrap: str, kafka_settings: KafkaSettings) -> Iterator[str]:
    from ragwarm.kafka.admin import create_topics, delete_topics

    prefix = f"tw.{uuid.uuid4().hex[:10]}."
    specs = prefixed(prefix)
    create_topics(kafka_bootstrap, kafka_settings.client_options(), specs)
    yield prefix
    delete_topics(kafka_bootstrap, kafka_settings.client_options(), [s.name for s in specs])


@pytest.fixture(scope="module")
def worker(
    worker_factory: Callable[..., WorkerProc],
    kafka_bootstrap: str,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProc]:
    warm_set = tmp_path_factory.mktemp("warm") / "warm.jsonl"
    items = [{"prompt": text, "tenant": WARM_TENANT} for text in WARM_TEXTS]
    warm_set.write_text("\n".join(json.dumps(item) for item in items) + "\n")
    proc = worker_factory(
        f"w-{uuid.uuid4().hex[:8]}",
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=namespace,
        api_key=API_KEY,
        env={"RAGWARM_WORKER_HEARTBEAT_S": "1"},
        args=["--warm-set", str(warm_set)],
    )
    # Probing starts with the process, so the probes cover the whole start-up.
    yield proc.start().wait_ready()
    proc.stop()


@pytest.fixture
def events(kafka_bootstrap: str, namespace: str, worker: WorkerProc) -> Iterator[WorkerEvents]:
    reader = WorkerEvents(kafka_bootstrap, namespace + WORKER_EVENTS, worker.worker_id,
                          from_start=False)
    yield reader
    reader.close()


@pytest.fixture
def send(kafka_producer: KafkaProducer, namespace: str) -> Callable[..., None]:
    def send_command(command: WarmupCommand | bytes, key: str = "0" * 32) -> None:
        value = command if isinstance(command, bytes) else encode(command)
        kafka_producer.send(namespace + WARMUP_COMMANDS, key=key.encode(), value=value)
        kafka_producer.flush()

    return send_command


def cache_items(worker: WorkerProc) -> dict[str, dict]:
    return {item["prefix_hash"]: item for item in worker.get("/v1/cache").json()["items"]}


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- readiness and status events ------------------------------------------------------------


def test_ready_only_after_model_and_warm_set(worker: WorkerProc, tokenizer) -> None:
    statuses = [p.status for p in worker.probes]
    assert statuses[-1] == 200
    first_ready = statuses.index(200)
    assert 503 in statuses[:first_ready], f"never saw 503 before ready: {statuses}"
    assert all(s in (None, 503) for s in statuses[:first_ready])
    reasons = {p.reason for p in worker.probes if p.status == 503}
    assert all(reasons) and any("loading model" in r for r in reasons), reasons
    warm = {prefix_hash(tokens(tokenizer, t), WARM_TENANT) for t in WARM_TEXTS}
    items = cache_items(worker)
    assert warm <= set(items)
    assert all(items[h]["pinned"] for h in warm)


def test_ready_event_lists_the_warm_set_then_heartbeats(
    worker: WorkerProc, kafka_bootstrap: str, namespace: str, tokenizer
) -> None:
    reader = WorkerEvents(kafka_bootstrap, namespace + WORKER_EVENTS, worker.worker_id,
                          from_start=True)
    try:
        ready = reader.wait_for(lambda e: e.kind == "ready", "ready")
        heartbeat = reader.wait_for(lambda e: e.kind == "heartbeat", "heartbeat")
    finally:
        reader.close()
    warm = {prefix_hash(tokens(tokenizer, t), WARM_TENANT) for t in WARM_TEXTS}
    assert ready.url == worker.url
    assert warm <= set(ready.warm_prefixes)
    assert ready.entries >= len(WARM_TEXTS)
    assert 0 < ready.mem_used_bytes < ready.mem_total_bytes
    assert heartbeat.mem_total_bytes == ready.mem_total_bytes
    assert warm <= set(heartbeat.warm_prefixes)


# -- the acceptance scenario ------------------------------------------------------------------


def test_prefill_command_makes_a_hit_and_invalidation_frees_it(
    worker: WorkerProc, events: WorkerEvents, send, tokenizer
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    chunks = [
        "The mill on the river was built in 1820 and rebuilt after the flood of 1911.",
        "Its wheel drives two pairs of stones; the miller lives in the house by the weir.",
    ]
    refs = [
        ChunkRef(chunk_id=f"mill#{i}", content_hash=content_hash(c)) for i, c in enumerate(chunks)
    ]
    prefix = tokens(tokenizer, "You answer from the context.\n" + "\n".join(chunks) + "\n")
    question = tokens(tokenizer, "Question: when was the mill built?\nAnswer:")
    full_blocks = len(prefix) // 16 * 16
    expected_hash = prefix_hash(prefix, tenant)
    before = worker.get("/v1/cache").json()["bytes_used"]

    command = WarmupCommand(
        command_id=f"c-{uuid.uuid4().hex[:8]}",
        op="prefill",
        worker_id=worker.worker_id,
        tenant=tenant,
        prefix_hash=expected_hash,
        token_ids=prefix,
        chunk_refs=refs,
        pin=True,
    )
    send(command, key=expected_hash)
    stored = events.wait_for(
        lambda e: e.kind == "stored" and e.command_id == command.command_id, "stored"
    )
    assert (stored.prefix_hash, stored.tenant, stored.prefix_tokens) == (
        expected_hash,
        tenant,
        full_blocks,
    )
    assert stored.bytes > 0 and set(stored.chunk_refs) == set(refs)
    assert stored.mem_used_bytes == before + stored.bytes

    metrics_before = worker.get("/metrics").text
    answer = completion(worker, prefix + question, tenant)
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= full_blocks
    assert answer["usage"]["prompt_tokens"] == len(prefix + question)
    metrics_after = worker.get("/metrics").text
    hits = (("vllm:prefix_cache_hits_total", cached), ("ragwarm_worker_warmup_hits_total", 1))
    for name, delta in hits:
        assert metric(metrics_after, name) - metric(metrics_before, name) == delta, name
    assert metric(metrics_after, "warmup_hit_rate") > 0

    invalidate = WarmupCommand(
        command_id=f"c-{uuid.uuid4().hex[:8]}",
        op="invalidate",
        tenant=tenant,
        chunk_refs=refs[1:],
    )
    send(invalidate, key=expected_hash)
    gone = events.wait_for(
        lambda e: e.kind == "invalidated" and e.prefix_hash == expected_hash, "invalidated"
    )
    assert gone.command_id == invalidate.command_id and gone.bytes == stored.bytes
    time.sleep(0.5)  # the extension cached by the completion goes in the same command
    assert expected_hash not in cache_items(worker)
    assert worker.get("/v1/cache").json()["bytes_used"] == before

    misses = "ragwarm_worker_kv_cache_misses_total"
    misses_before = metric(worker.get("/metrics").text, misses)
    again = completion(worker, prefix + question, tenant)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metric(worker.get("/metrics").text, misses) == misses_before + 1
    assert again["choices"][0]["text"] == answer["choices"][0]["text"]  # greedy: same answer


def test_foreign_and_malformed_commands_are_skipped(
    worker: WorkerProc, events: WorkerEvents, send, tokenizer
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ids = tokens(tokenizer, WARM_TEXTS[0])
    malformed_name = "ragwarm_worker_commands_malformed_total"
    malformed_before = metric(worker.get("/metrics").text, malformed_name)
    foreign = WarmupCommand(
        command_id="c-foreign",
        op="prefill",
        worker_id="someone-else",
        tenant=tenant,
        token_ids=ids,
    )
    # One key: one partition, so the worker sees them in this order.
    send(foreign)
    send(b"\xff not json")
    send(json.dumps({"schema_name": "warmup_command", "command_id": "x", "op": "melt"}).encode())
    mine = WarmupCommand(command_id="c-mine", op="prefill", tenant=tenant, token_ids=ids[:40])
    send(mine)
    stored = events.wait_for(lambda e: e.command_id == "c-mine", "stored for c-mine")
    assert stored.kind == "stored" and stored.prefix_tokens == 32
    assert not [e for _, e in events.seen if e.command_id == "c-foreign"]
    malformed = metric(worker.get("/metrics").text, malformed_name)
    assert malformed - malformed_before == 2


def test_extend_ttl_and_release(worker: WorkerProc, events: WorkerEvents, send, tokenizer) -> None:
    target = prefix_hash(tokens(tokenizer, WARM_TEXTS[2]), WARM_TENANT)
    ttl_before = cache_items(worker)[target]["expires_in_s"]
    extend = WarmupCommand(command_id="c-ttl", op="extend_ttl", prefix_hash=target, ttl_s=86_400)
    release = WarmupCommand(command_id="c-rel", op="release", prefix_hash=target)
    send(extend, key=target)
    send(release, key=target)
    extended = events.wait_for(lambda e: e.command_id == "c-ttl", "ttl_extended")
    released = events.wait_for(lambda e: e.command_id == "c-rel", "released")
    assert (extended.kind, released.kind) == ("ttl_extended", "released")
    assert extended.prefix_hash == released.prefix_hash == target
    item = cache_items(worker)[target]
    assert item["expires_in_s"] > max(ttl_before, 80_000) and not item["pinned"]


# -- HTTP API ---------------------------------------------------------------------------------


def test_streaming_matches_the_plain_answer(worker: WorkerProc, tokenizer) -> None:
    prompt = WARM_TEXTS[0] + " Which season comes after season 3?"
    plain = completion(worker, prompt, WARM_TENANT, max_tokens=6)
    body = {
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": 0,
        "tenant": WARM_TENANT,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{worker.url}/v1/completions", json=body, headers=worker.headers, timeout=120
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == plain["choices"][0]["text"]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["ttft_ms"] > 0
    assert (
        usage["prompt_tokens_details"]["cached_tokens"]
        >= len(tokens(tokenizer, WARM_TEXTS[0])) // 16 * 16 - 16
    )


def test_models_lists_the_served_model(worker: WorkerProc) -> None:
    cards = worker.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards] == [ModelSettings().llm_name]


BAD_REQUESTS = [
    ({"max_tokens": 4}, 400, "prompt"),
    ({"prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
    ({"prompt": "hi", "temperature": 7}, 400, "temperature"),
    ({"prompt": "hi", "n": 2}, 400, "n"),
    ({"prompt": []}, 400, "empty"),
    ({"prompt": [10**9]}, 400, "vocabulary"),
    ({"prompt": [1] * 5000}, 400, "limit of 4096"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "does not exist"),
    ({"prompt": "hi", "stop": ["\n"]}, 400, "stop"),
    (["a", "list"], 400, "JSON object"),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD_REQUESTS)
def test_bad_completion_requests_get_4xx_with_a_message(
    worker: WorkerProc, body: object, status: int, words: str
) -> None:
    response = worker.post("/v1/completions", body)
    assert response.status_code == status
    error = response.json()["error"]
    assert words in error["message"] and error["type"]


def test_malformed_and_oversized_bodies(worker: WorkerProc) -> None:
    url = f"{worker.url}/v1/completions"
    bad_json = httpx.post(url, content=b"{nope", headers=worker.headers, timeout=30)
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    huge = httpx.post(url, content=b"x" * (2 << 20), headers=worker.headers, timeout=30)
    assert huge.status_code == 413 and huge.json()["error"]["message"]
    both = worker.post("/v1/prefill", {"token_ids": [1, 2], "prompt": "x"})
    assert both.status_code == 400 and "exactly one" in both.json()["error"]["message"]
    missing = worker.get("/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["message"]


def test_bearer_token_is_enforced_except_on_health(worker: WorkerProc) -> None:
    for path in ("/v1/models", "/v1/cache", "/metrics"):
        assert httpx.get(worker.url + path, timeout=30).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(worker.url + path, headers=wrong, timeout=30).status_code == 401
        assert worker.get(path).status_code == 200
    anonymous = httpx.post(f"{worker.url}/v1/completions", json={"prompt": "hi"}, timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["type"] == "authentication_error"
    for path in ("/health/live", "/health/ready"):
        assert httpx.get(worker.url + path, timeout=30).status_code == 200


def test_prefill_endpoint_stores_a_prefix(worker: WorkerProc, tokenizer) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ids = tokens(tokenizer, WARM_TEXTS[1])
    body = {"token_ids": ids, "tenant": tenant, "pin": False, "ttl_s": 60}
    first = worker.post("/v1/prefill", body).json()
    again = worker.post("/v1/prefill", body).json()
    assert first["prefix_hash"] == prefix_hash(ids, tenant)
    assert first["prefix_tokens"] == len(ids) // 16 * 16 and first["computed_tokens"] > 0
    assert again["computed_tokens"] == 0
    assert cache_items(worker)[first["prefix_hash"]]["pinned"] is False


# -- shutdown (last: it stops the module's worker) ---------------------------------------------


def test_clean_stop_publishes_stopped(worker: WorkerProc, events: WorkerEvents) -> None:
    assert worker.stop() == 0
    stopped = events.wait_for(lambda e: e.kind == "stopped", "stopped")
    assert stopped.url == worker.url
