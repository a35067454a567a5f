"""The worker's metrics: vLLM's names and `ragwarm_worker_*` count each request once, and
seed 000's four aliases repeat what the conventional metrics count."""

from __future__ import annotations

import threading

import pytest

from workers.engine_lock import EngineLock
from workers.metrics import SEED_ALIASES, Served, WorkerMetrics, classify

MODEL = {"model_name": "m"}


def test_metrics_follow_each_request() -> None:
    m = WorkerMetrics(worker_id="w", model_name="m")
    m.observe(Served(prompt_tokens=40, cached_tokens=0, full_blocks=2, ttft_s=1.0,
                     cache_was_empty=True, generation_tokens=5, finish_reason="length"))
    m.observe(Served(prompt_tokens=40, cached_tokens=32, full_blocks=2, ttft_s=0.1,
                     cache_was_empty=False, generation_tokens=3))
    m.observe(Served(prompt_tokens=10, cached_tokens=0, full_blocks=0, ttft_s=0.1,
                     cache_was_empty=False, generation_tokens=1))
    m.cache_state(used=300, capacity=1200, entries=2, pinned=1)
    r = m.registry
    success = "vllm:request_success_total"
    assert r.get_sample_value(success, {**MODEL, "finished_reason": "stop"}) == 2
    assert r.get_sample_value(success, {**MODEL, "finished_reason": "length"}) == 1
    assert r.get_sample_value("vllm:prompt_tokens_total", MODEL) == 90
    assert r.get_sample_value("vllm:generation_tokens_total", MODEL) == 9
    assert r.get_sample_value("vllm:prefix_cache_queries_total", MODEL) == 90
    assert r.get_sample_value("vllm:prefix_cache_hits_total", MODEL) == 32
    assert r.get_sample_value("vllm:time_to_first_token_seconds_count", MODEL) == 3
    assert r.get_sample_value("vllm:time_to_first_token_seconds_sum", MODEL) == pytest.approx(1.2)
    assert r.get_sample_value("vllm:kv_cache_usage_perc", MODEL) == 0.25
    assert r.get_sample_value("ragwarm_worker_cold_starts_total") == 1
    assert r.get_sample_value("ragwarm_worker_warmup_lookups_total") == 2  # the short prompt
    assert r.get_sample_value("ragwarm_worker_warmup_hits_total") == 1
    assert r.get_sample_value("ragwarm_worker_kv_cache_misses_total") == 1
    assert r.get_sample_value("ragwarm_worker_kv_cache_usage_bytes") == 300
    assert r.get_sample_value("ragwarm_worker_kv_cache_capacity_bytes") == 1200
    assert r.get_sample_value("ragwarm_worker_kv_cache_warm_prefixes") == 1


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


def test_the_seed_aliases_repeat_the_conventional_metrics() -> None:
    m = WorkerMetrics(worker_id="w", model_name="m")
    for cached, blocks, empty in ((0, 2, True), (32, 2, False), (0, 2, False), (0, 0, False)):
        m.observe(Served(prompt_tokens=40, cached_tokens=cached, full_blocks=blocks,
                         ttft_s=0.1, cache_was_empty=empty))
    r = m.registry
    for seed, named in (("kv_cache_miss_total", "ragwarm_worker_kv_cache_misses_total"),
                        ("cold_start_count_total", "ragwarm_worker_cold_starts_total")):
        assert r.get_sample_value(seed) == r.get_sample_value(named) > 0
    assert r.get_sample_value("first_token_latency_count") == 4
    assert r.get_sample_value("first_token_latency_sum") == pytest.approx(
        r.get_sample_value("vllm:time_to_first_token_seconds_sum", MODEL))
    # The since-start ratio is hits over every request, as the seed defines it.
    assert r.get_sample_value("warmup_hit_rate") == 0.25
    assert set(SEED_ALIASES) == {"first_token_latency", "cold_start_count", "kv_cache_miss",
                                 "warmup_hit_rate"}


def gauges(m: WorkerMetrics) -> tuple[float | None, float | None]:
    r = m.registry
    return (r.get_sample_value("vllm:num_requests_waiting", MODEL),
            r.get_sample_value("vllm:num_requests_running", MODEL))


def test_a_request_waits_then_runs_then_leaves_both_gauges() -> None:
    m = WorkerMetrics(worker_id="w", model_name="m")
    assert gauges(m) == (0, 0)
    with m.in_flight() as started:
        assert gauges(m) == (1, 0)
        started()
        started()  # once only
        assert gauges(m) == (0, 1)
    assert gauges(m) == (0, 0)


def test_a_request_that_fails_while_waiting_leaves_the_waiting_gauge() -> None:
    m = WorkerMetrics(worker_id="w", model_name="m")
    with pytest.raises(RuntimeError), m.in_flight():
        raise RuntimeError("interrupted before it took the engine")
    assert gauges(m) == (0, 0)


def test_requests_waiting_for_the_engine_are_counted_as_waiting() -> None:
    m, lock = WorkerMetrics(worker_id="w", model_name="m"), EngineLock()
    took, release = threading.Event(), threading.Event()

    def request() -> None:
        with m.in_flight() as started, lock.serving():
            started()
            took.set()
            release.wait(5)

    first = threading.Thread(target=request)
    first.start()
    assert took.wait(5)
    second = threading.Thread(target=request)
    second.start()
    while lock.waiting_requests < 1:
        threading.Event().wait(0.001)
    assert gauges(m) == (1, 1)
    release.set()
    first.join(5)
    second.join(5)
    assert gauges(m) == (0, 0)
