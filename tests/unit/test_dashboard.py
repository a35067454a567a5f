"""Every metric the Grafana dashboard queries is one the worker or the streams app exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streams.metrics import StreamsMetrics, snapshot
from workers.metrics import Served, WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "ragwarm.json"
NAME = re.compile(r"\b(?:ragwarm_|vllm:)[a-zA-Z0-9_:]*")


def exported() -> set[str]:
    """Sample names (with _bucket/_sum/_count/_total) of both registries, every family filled."""
    worker = WorkerMetrics(worker_id="w", model_name="m")
    worker.observe(Served(prompt_tokens=32, cached_tokens=16, full_blocks=2, ttft_s=0.1,
                          cache_was_empty=True))
    worker.cache_state(used=1, capacity=2, entries=1, pinned=0)
    streams = StreamsMetrics()
    streams.event_to_warm.observe(1.0)
    streams.commands.labels(op="prefill").inc()
    streams.watch(lambda: snapshot({"kb_events": 1}, {"docs": 1}, 0, {"t": 1}, {"t": 1},
                                   {("t", 0): 0}))
    names = set()
    for text in (worker.render(), streams.render()):
        for family in text_string_to_metric_families(text.decode()):
            names |= {s.name for s in family.samples}
    return names


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
    for wanted in ("ragwarm_time_to_first_token_seconds_bucket", "ragwarm_cold_starts_total",
                   "ragwarm_warmup_hits_total", "ragwarm_kv_cache_misses_total",
                   "vllm:kv_cache_usage_perc", "ragwarm_streams_dead_letters_total",
                   "ragwarm_streams_event_to_warm_seconds_bucket"):
        assert wanted in names
