"""The worker's `ragwarm_*` and vLLM-named metrics count what the seed's metrics count."""

from __future__ import annotations

import pytest

from workers.metrics import Served, WorkerMetrics, classify


def test_named_metrics_follow_each_request() -> None:
    m = WorkerMetrics(worker_id="w", model_name="m")
    m.observe(Served(prompt_tokens=40, cached_tokens=0, full_blocks=2, ttft_s=1.0,
                     cache_was_empty=True))
    m.observe(Served(prompt_tokens=40, cached_tokens=32, full_blocks=2, ttft_s=0.1,
                     cache_was_empty=False))
    m.observe(Served(prompt_tokens=10, cached_tokens=0, full_blocks=0, ttft_s=0.1,
                     cache_was_empty=False))
    m.cache_state(used=300, capacity=1200, entries=2, pinned=1)
    r = m.registry
    assert r.get_sample_value("ragwarm_requests_total") == 3
    assert r.get_sample_value("ragwarm_cold_starts_total") == 1
    assert r.get_sample_value("ragwarm_warmup_lookups_total") == 2  # the short prompt can't hit
    assert r.get_sample_value("ragwarm_warmup_hits_total") == 1
    assert r.get_sample_value("ragwarm_kv_cache_misses_total") == 1
    assert r.get_sample_value("ragwarm_cached_prompt_tokens_total") == 32
    assert r.get_sample_value("ragwarm_time_to_first_token_seconds_count") == 3
    assert r.get_sample_value("ragwarm_time_to_first_token_seconds_sum") == pytest.approx(1.2)
    model = {"model_name": "m"}
    assert r.get_sample_value("vllm:time_to_first_token_seconds_count", model) == 3
    assert r.get_sample_value("vllm:kv_cache_usage_perc", model) == 0.25
    assert r.get_sample_value("ragwarm_kv_cache_usage_bytes") == 300


@pytest.mark.parametrize(("cached", "blocks", "empty", "expected"), [
    (0, 2, True, {"lookup", "miss", "cold"}),
    (32, 2, False, {"lookup", "hit"}),
    (0, 0, False, set()),  # shorter than a block: nothing a cache could serve
    (8, 0, False, {"hit"}),  # a server that caches below block size still reports a hit
])
def test_one_classification_of_a_request(cached, blocks, empty, expected) -> None:
    served = Served(prompt_tokens=40, cached_tokens=cached, full_blocks=blocks, ttft_s=0.1,
                    cache_was_empty=empty)
    assert classify(served) == expected


def test_both_name_sets_count_the_same_outcomes() -> None:
    m = WorkerMetrics(worker_id="w", model_name="m")
    for cached, blocks, empty in ((0, 2, True), (32, 2, False), (0, 2, False), (0, 0, False)):
        m.observe(Served(prompt_tokens=40, cached_tokens=cached, full_blocks=blocks,
                         ttft_s=0.1, cache_was_empty=empty))
    r = m.registry
    for seed, named in (("worker_prefix_hits_total", "ragwarm_warmup_hits_total"),
                        ("kv_cache_miss_total", "ragwarm_kv_cache_misses_total"),
                        ("cold_start_count_total", "ragwarm_cold_starts_total")):
        assert r.get_sample_value(seed) == r.get_sample_value(named)
    assert r.get_sample_value("warmup_hit_rate") == 0.25
