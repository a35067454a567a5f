"""Every metric the Grafana dashboard queries is one the worker, streams app or gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ragwarm.client.rag import Answer
from ragwarm.gateway.metrics import GatewayMetrics
from streams.shell.metrics import StreamsMetrics, snapshot
from workers.metrics import Served, WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "ragwarm.json"
NAME = re.compile(r"\b(?:ragwarm_|vllm:)[a-zA-Z0-9_:]*")


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


# One of each kind of figure the pipeline counts: counts, timers (sums and maxima in ms),
# a size, dead letters.
STREAMS_STATS = {"kb_events": 1, "stale_hits": 2, "embed_ms": 1200, "op_lag_ms": 30,
                 "op_lag_max_ms": 20, "kv_bytes_per_token": 64, "dead_letters": 1}


def exported() -> set[str]:
    """Sample names (with _bucket/_sum/_count/_total) of the three registries."""
    return {s.name for text in scrapes().values()
            for family in text_string_to_metric_families(text) for s in family.samples}


def answer(failed: tuple[str, ...] = ()) -> Answer:
    return Answer(question="q", tenant="t", qid="1", text="a", worker_id="w", ttft_ms=30.0,
                  worker_ttft_ms=20.0, e2e_ttft_ms=45.0, total_ms=90.0, retrieve_ms=12.0,
                  route_ms=1.0, prompt_tokens=100, cached_tokens=64, completion_tokens=4,
                  prefix_tokens=80, prefix_hash="h", matched_blocks=4, chunk_refs=(),
                  doc_ids=("d",), finish_reason="stop", failed_workers=failed)


def queried() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dash["panels"] for t in panel.get("targets", ())]
    assert exprs, "the dashboard has no queries"
    return {m for expr in exprs for m in NAME.findall(expr)}


def test_every_dashboard_metric_is_exported() -> None:
    missing = queried() - exported()
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"


def test_the_dashboard_shows_the_metrics_operators_look_for() -> None:
    names = queried()
    for wanted in ("vllm:time_to_first_token_seconds_bucket",
                   "ragwarm_worker_cold_starts_total", "ragwarm_worker_warmup_hits_total",
                   "ragwarm_worker_warmup_lookups_total", "ragwarm_worker_kv_cache_misses_total",
                   "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                   "vllm:num_requests_waiting", "vllm:generation_tokens_total",
                   "ragwarm_streams_dead_letters_total",
                   "ragwarm_streams_event_to_warm_seconds_bucket",
                   "ragwarm_gateway_requests_total", "ragwarm_gateway_cached_tokens_total",
                   "ragwarm_gateway_request_duration_seconds_bucket",
                   "ragwarm_gateway_retrieval_duration_seconds_bucket",
                   "ragwarm_gateway_failovers_total", "ragwarm_worker_engine_wait_seconds_bucket",
                   "ragwarm_worker_engine_overdue_turns_total",
                   "ragwarm_streams_time_seconds_total"):
        assert wanted in names


def test_an_answer_counts_its_tokens_retrieval_time_and_failovers() -> None:
    metrics = GatewayMetrics()
    metrics.answered(answer(failed=("w1", "w2")), stream=False)
    registry = metrics.registry
    assert registry.get_sample_value("ragwarm_gateway_cached_tokens_total") == 64
    assert registry.get_sample_value("ragwarm_gateway_prompt_tokens_total") == 100
    assert registry.get_sample_value("ragwarm_gateway_failovers_total") == 2
    assert registry.get_sample_value("ragwarm_gateway_retrieval_duration_seconds_sum") == 0.012
    assert registry.get_sample_value("ragwarm_gateway_answers_total", {"stream": "false"}) == 1
