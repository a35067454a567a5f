"""Every metric the Grafana dashboard queries is one the worker, streams app or gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ragwarm.gateway.metrics import GatewayMetrics
from tests.unit.metrics_kit import answer, scrapes

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "ragwarm.json"
NAME = re.compile(r"\b(?:ragwarm_|vllm:)[a-zA-Z0-9_:]*")


# One of each kind of figure the pipeline counts: counts, timers (sums and maxima in ms),
# a size, dead letters.
def exported() -> set[str]:
    """Sample names (with _bucket/_sum/_count/_total) of the three registries."""
    return {s.name for text in scrapes().values()
            for family in text_string_to_metric_families(text) for s in family.samples}


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
