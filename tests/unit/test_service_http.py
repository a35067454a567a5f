"""The worker's HTTP layer and runtime in-process, over a tiny deterministic stand-in engine.

The real model and Kafka are exercised in tests/integration/test_worker_service.py; here a
toy engine (4-token blocks, one fixed output token) makes the service logic fast to test.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from schemas import ChunkRef, WarmupCommand
from tests.unit.worker_fakes import (
    KV_PER_TOKEN,
    GatedLifecycle,
    complete,
    entries_reach,
    serve,
    wait_ready,
)
from workers.runtime import WorkerRuntime
from workers.service import STATE

HASH = "ab" * 16


async def test_not_ready_until_boot_finishes_then_ready_event() -> None:
    lifecycle = GatedLifecycle()
    client = await serve(lifecycle)
    try:
        response = await client.get("/health/ready")
        assert response.status == 503
        assert (await response.json())["reason"] == "loading model"
        refused = await client.post("/v1/completions", json={"prompt": "hi"})
        assert refused.status == 503
        assert (await refused.json())["error"]["type"] == "service_unavailable"
        assert (await client.get("/health/live")).status == 200
        lifecycle.gate.set()
        await wait_ready(client)
        assert lifecycle.sink.kinds()[0] == "ready"
    finally:
        await client.close()
    assert lifecycle.sink.kinds()[-1] == "stopped" and lifecycle.stopped
    # Every event names the node (the streams app keeps a hot worker on each).
    assert {e.node for e in lifecycle.sink.events} == {"node-1"}


async def test_prefill_then_hit_then_reactive_extension(booted) -> None:
    client, lifecycle = booted
    stored = await (await client.post("/v1/prefill", json={"token_ids": list(range(10))})).json()
    assert (stored["prefix_tokens"], stored["computed_tokens"]) == (8, 8)
    answer = await complete(client, list(range(14)))
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
    assert answer["choices"][0]["text"] == "xx"
    cache = await entries_reach(client, 2)  # the reactive admission follows the answer
    assert sorted(i["tokens"] for i in cache["items"]) == [8, 12]
    # Two prefixes, one chain of 3 blocks: the first 2 are shared and count once.
    assert sorted((i["kind"], i["blocks"]) for i in cache["items"]) == [
        ("managed", 2),
        ("request", 3),
    ]
    blocks = cache["blocks"]
    assert (blocks["blocks"], blocks["shared_blocks"]) == (3, 2)
    assert (blocks["managed_blocks"], blocks["request_blocks"]) == (2, 1)
    assert blocks["bytes"] == cache["bytes_used"] == 12 * KV_PER_TOKEN
    assert blocks["request_bytes"] == 4 * KV_PER_TOKEN
    metrics = lifecycle.metrics.registry
    assert metrics.get_sample_value("ragwarm_worker_kv_cache_blocks", {"kind": "shared"}) == 2
    block_bytes = "ragwarm_worker_kv_cache_block_bytes"
    assert metrics.get_sample_value(block_bytes, {"kind": "managed"}) == 80
    assert metrics.get_sample_value("vllm:prefix_cache_hits_total", {"model_name": "toy"}) == 8
    assert metrics.get_sample_value("ragwarm_worker_cold_starts_total") == 0
    assert metrics.get_sample_value("ragwarm_worker_prefills_total", {"source": "request"}) == 1
    # Each took the engine once: the prefill as background work, the answer as a request.
    waits = "ragwarm_worker_engine_wait_seconds_count"
    assert metrics.get_sample_value(waits, {"work": "warmup"}) == 1
    assert metrics.get_sample_value(waits, {"work": "request"}) == 1
    await complete(client, list(range(14)))  # every full block is cached now: nothing stored
    assert metrics.get_sample_value("ragwarm_worker_prefills_total", {"source": "request"}) == 1
    toy = {"model_name": "toy"}
    generated = 2 * answer["usage"]["completion_tokens"]
    assert metrics.get_sample_value("vllm:generation_tokens_total", toy) == generated > 0
    # The request leaves the running gauge after its response is written: the client may
    # read the body first (a race seen on a loaded machine), so wait for it.
    for _ in range(500):
        if metrics.get_sample_value("vllm:num_requests_running", toy) == 0:
            break
        await asyncio.sleep(0.01)
    assert metrics.get_sample_value("vllm:num_requests_running", toy) == 0
    assert metrics.get_sample_value("vllm:num_requests_waiting", toy) == 0


async def test_first_request_on_an_empty_cache_is_a_cold_start(booted) -> None:
    client, lifecycle = booted
    first = await complete(client, list(range(9)), tenant="t")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert lifecycle.metrics.registry.get_sample_value("ragwarm_worker_cold_starts_total") == 1
    assert lifecycle.metrics.registry.get_sample_value("ragwarm_worker_kv_cache_misses_total") == 1


async def test_invalidation_by_chunk_removes_extensions_and_reports_in_order(booted) -> None:
    client, lifecycle = booted
    runtime = lifecycle_runtime(client)
    ref = ChunkRef(chunk_id="doc#0", content_hash="cd" * 16)
    prefill = WarmupCommand(
        command_id="c1", op="prefill", token_ids=list(range(8)), chunk_refs=[ref], pin=True
    )
    assert await asyncio.to_thread(runtime.apply, prefill) == "stored"
    await complete(client, list(range(13)))  # cached reactively as a 12-token extension
    await entries_reach(client, 2)
    invalidate = WarmupCommand(command_id="c2", op="invalidate", chunk_refs=[ref])
    assert await asyncio.to_thread(runtime.apply, invalidate) == "invalidated"
    cache_events = [e for e in lifecycle.sink.events if e.kind not in ("ready", "heartbeat")]
    assert [(e.kind, e.prefix_tokens, e.command_id) for e in cache_events] == [
        ("stored", 8, "c1"),
        ("stored", 12, None),
        ("invalidated", 8, "c2"),
        ("invalidated", 12, "c2"),
    ]
    assert cache_events[-1].mem_used_bytes == 0 and cache_events[0].chunk_refs == [ref]
    assert (await (await client.get("/v1/cache")).json())["entries"] == 0


async def test_an_invalidation_command_evicts_its_tenants_prefix_only(booted) -> None:
    # Two tenants indexed the same document: same chunk ref, same tokens, own chains.
    client, lifecycle = booted
    runtime = lifecycle_runtime(client)
    ref = ChunkRef(chunk_id="doc#0", content_hash="cd" * 16)
    for n, tenant in enumerate(("acme", "globex")):
        prefill = WarmupCommand(command_id=f"p{n}", op="prefill", tenant=tenant,
                                token_ids=list(range(8)), chunk_refs=[ref], pin=True)
        assert await asyncio.to_thread(runtime.apply, prefill) == "stored"
    invalidate = WarmupCommand(command_id="c2", op="invalidate", tenant="acme", chunk_refs=[ref])
    assert await asyncio.to_thread(runtime.apply, invalidate) == "invalidated"
    gone = [e.tenant for e in lifecycle.sink.events if e.kind == "invalidated"]
    assert gone == ["acme"]
    assert (await (await client.get("/v1/cache")).json())["entries"] == 1


async def test_unknown_prefix_commands_are_not_found(booted) -> None:
    client, _ = booted
    runtime = lifecycle_runtime(client)
    for op in ("extend_ttl", "release", "invalidate"):
        command = WarmupCommand(command_id="c", op=op, prefix_hash=HASH, ttl_s=5)
        assert await asyncio.to_thread(runtime.apply, command) == "not_found"


async def test_a_chunk_prefill_on_an_engine_without_chunk_kv_is_refused(booted) -> None:
    client, lifecycle = booted
    runtime = lifecycle_runtime(client)
    ref = ChunkRef(chunk_id="doc#0", content_hash=HASH)
    command = WarmupCommand(command_id="cc", op="prefill_chunk", token_ids=[5, 6, 7, 8],
                            opening_ids=[1, 2], chunk_refs=[ref])
    assert await asyncio.to_thread(runtime.apply, command) == "refused"
    refused = [e for e in lifecycle.sink.events if e.kind == "refused"]
    assert refused[-1].command_id == "cc" and "no chunk KV" in (refused[-1].reason or "")


async def test_chunk_spans_reach_the_engine_with_the_opt_out(booted) -> None:
    client, _ = booted
    spans = [{"chunk_id": "doc#0", "content_hash": HASH, "start": 2, "end": 6},
             {"chunk_id": "doc#1", "content_hash": "ef" * 16, "start": 6, "end": 9}]
    answer = await complete(client, list(range(12)), chunk_spans=spans, chunk_reuse=False)
    assert answer["usage"]["prompt_tokens_details"]["blended_tokens"] == 0
    request = lifecycle_runtime(client).engine.last_request
    assert [(s.ref, s.start, s.end) for s in request.chunks] == [
        (("doc#0", HASH), 2, 6), (("doc#1", "ef" * 16), 6, 9)
    ]
    assert request.chunk_reuse is False


@pytest.mark.parametrize(("prompt", "spans", "message"), [
    (list(range(12)), [(2, 6), (5, 9)], "overlap"),
    (list(range(12)), [(2, 12)], "before the prompt's last token"),
    (list(range(12)), [(6, 6)], "start < end"),
    ("some text prompt", [(0, 3)], "token ids"),
])
async def test_bad_chunk_spans_are_refused_with_a_message(booted, prompt, spans, message):
    client, _ = booted
    body = {"prompt": prompt, "max_tokens": 1, "chunk_spans": [
        {"chunk_id": f"doc#{i}", "content_hash": HASH, "start": a, "end": b}
        for i, (a, b) in enumerate(spans)
    ]}
    response = await client.post("/v1/completions", json=body)
    assert response.status == 400
    error = (await response.json())["error"]
    assert message in error["message"] and error["param"] == "chunk_spans"


async def test_stream_frames_end_with_usage_and_done(booted) -> None:
    client, _ = booted
    body = {"prompt": "hello there", "max_tokens": 3, "stream": True, "return_token_ids": True}
    response = await client.post("/v1/completions", json=body)
    assert response.headers["Content-Type"].startswith("text/event-stream")
    frames = (await response.text()).strip().split("\n\n")
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["x", "x", "x"]
    assert [c["choices"][0]["token_ids"] for c in chunks[:3]] == [[7], [7], [7]]
    assert chunks[2]["choices"][0]["finish_reason"] == "length"
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["completion_tokens"] == 3
    no_usage = {**body, "stream_options": {"include_usage": False}}
    frames = (await (await client.post("/v1/completions", json=no_usage)).text()).split("\n\n")
    assert not any('"usage"' in f for f in frames)


async def test_bearer_token() -> None:
    lifecycle = GatedLifecycle()
    lifecycle.gate.set()
    client = await serve(lifecycle, api_key="s3cret")
    try:
        await wait_ready(client)
        assert (await client.get("/v1/models")).status == 401
        assert (await client.get("/metrics", headers={"Authorization": "Bearer x"})).status == 401
        ok = await client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 200 and (await ok.json())["data"][0]["id"] == "toy"
    finally:
        await client.close()


def lifecycle_runtime(client: TestClient) -> WorkerRuntime:
    assert isinstance(client.server, TestServer) and client.server.app is not None
    state = client.server.app[STATE]
    assert state.runtime is not None
    return state.runtime
