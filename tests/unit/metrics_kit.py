"""The `/metrics` of each component with every registry filled by real use, for the tests of
the dashboard and of the metric names."""

from __future__ import annotations

from ragwarm.client.rag import Answer
from ragwarm.gateway.metrics import GatewayMetrics
from streams.shell.metrics import StreamsMetrics, snapshot
from workers.metrics import Served, WorkerMetrics


def scrapes() -> dict[str, str]:
    """`/metrics` of the worker, streams app and gateway, each registry filled by real use."""
    worker = WorkerMetrics(worker_id="w", model_name="m")
    worker.observe(Served(prompt_tokens=32, cached_tokens=16, full_blocks=2, ttft_s=0.1,
                          cache_was_empty=True, generation_tokens=4))
    worker.cache_state(used=1, capacity=2, entries=1, pinned=0)
    worker.block_state({"blocks": 2, "shared_blocks": 0, "managed_blocks": 1,
                        "request_blocks": 1, "pinned_blocks": 0, "bytes": 2,
                        "managed_bytes": 1, "request_bytes": 1, "pinned_bytes": 0})
    worker.engine_wait.labels(work="request").observe(0.01)
    worker.prefills.labels(source="command").inc()
    worker.commands.labels(op="prefill", result="stored").inc()
    worker.events.labels(kind="stored").inc()
    worker.set_ready(True)
    streams = StreamsMetrics()
    streams.event_to_warm.observe(1.0)
    streams.commands.labels(op="prefill").inc()
    streams.watch(lambda: snapshot(STREAMS_STATS, {"docs": 1}, 0, {"t": 1}, {"t": 1},
                                   {("t", 0): 0}))
    gateway = GatewayMetrics()
    gateway.request("/v1/chat/completions", 200, 0.5)
    gateway.answered(answer(), stream=True)
    gateway.stream_errors.inc()
    return {"worker": worker.render().decode(), "streams": streams.render().decode(),
            "gateway": gateway.render().decode()}


STREAMS_STATS = {"kb_events": 1, "stale_hits": 2, "embed_ms": 1200, "op_lag_ms": 30,
                 "op_lag_max_ms": 20, "kv_bytes_per_token": 64, "dead_letters": 1}


def answer(failed: tuple[str, ...] = ()) -> Answer:
    return Answer(question="q", tenant="t", qid="1", text="a", worker_id="w", ttft_ms=30.0,
                  worker_ttft_ms=20.0, e2e_ttft_ms=45.0, total_ms=90.0, retrieve_ms=12.0,
                  route_ms=1.0, prompt_tokens=100, cached_tokens=64, completion_tokens=4,
                  prefix_tokens=80, prefix_hash="h", matched_blocks=4, chunk_refs=(),
                  doc_ids=("d",), finish_reason="stop", failed_workers=failed)
