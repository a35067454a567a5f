"""The tiered policy's pure parts: seed 000's table beside ours, the restart scenario's
plan and figures, and a simulated worker's restart."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from ragwarm.bench.strategies import workload as wl
from ragwarm.bench.strategies.lanes import SimClock
from ragwarm.bench.strategies.metrics import json_report, summarize
from ragwarm.bench.strategies.policies import policy_class, policy_names
from ragwarm.bench.strategies.records import QueryRow
from ragwarm.bench.strategies.restart import restart_figures, restart_markdown, restart_step
from ragwarm.bench.strategies.seedtable import SEED_000, seed_markdown, seed_rows
from ragwarm.trace import Question, TraceEvent
from workers.cost_engine import CostEngine, CostModel, make_cache
from workers.kv.memory import Budget
from workers.sim import SimWorker

Q = Question(qid="q1", question="how?")
EDIT = TraceEvent(seq=1, timestamp=datetime(2026, 1, 1, tzinfo=UTC), op="upsert", doc_id="d")
BASE = QueryRow(
    policy="none", index=0, at=0.0, qid="q1", burst=False, post_edit=False, repeat=False,
    ttft_ms=100.0, prompt_tokens=100, prefix_tokens=90, cached_tokens=0, hit=False,
    partial=False, stale=False, outdated_partial=False, mem_share=0.5, pinned_share=0.0,
)


def steps(n_queries: int, edit_after: int = 0) -> list[wl.Step]:
    out: list[wl.Step] = [wl.QueryStep(float(i), i, Q, False) for i in range(n_queries)]
    out.insert(edit_after, wl.KbStep(0.5, EDIT))
    return out


# -- the policy ------------------------------------------------------------------------------


def test_tiered_is_registered_as_hybrid_over_a_disk_tier():
    assert "tiered" in policy_names()
    tiered, hybrid = policy_class("tiered"), policy_class("hybrid")
    assert issubclass(tiered, hybrid) and tiered.name == "tiered"
    assert tiered.disk_tier and not hybrid.disk_tier


def test_reactive_offload_is_request_caching_over_hybrids_host_tier():
    offload, reactive = policy_class("reactive-offload"), policy_class("reactive")
    hybrid = policy_class("hybrid")
    assert issubclass(offload, reactive) and offload.host_tier and hybrid.host_tier
    assert not (offload.disk_tier or hybrid.disk_tier or reactive.host_tier)
    assert policy_class("event-rag").host_tier is False  # the policies hybrid contains: none
    assert offload.eviction == reactive.eviction == "lru" and offload.cache_requests


def test_offline_evaluation_refuses_the_tiered_policy():
    from ragwarm.bench.strategies.offline import evaluate
    from ragwarm.bench.strategies.settings import StrategySettings

    with pytest.raises(ValueError, match="disk tier"):
        evaluate([], "tiered", StrategySettings(), 1 << 20)


# -- the restart plan ------------------------------------------------------------------------


def test_restart_step_is_the_query_at_the_fraction_skipping_kb_steps():
    plan = steps(10, edit_after=3)  # q0 q1 q2 KB q3 ...
    at = restart_step(plan, 0.5)
    assert isinstance(plan[at], wl.QueryStep) and plan[at].index == 5
    assert restart_step(plan, None) is None


def test_restart_step_never_precedes_the_first_query_nor_follows_the_last():
    plan = steps(10)
    first, last = restart_step(plan, 0.01), restart_step(plan, 0.99)
    assert plan[first].index == 1 and plan[last].index == 9
    assert restart_step(steps(1), 0.5) is None  # one query: no run to restart in


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.2, 1.5])
def test_restart_step_rejects_fractions_outside_the_run(fraction):
    with pytest.raises(ValueError, match="restart fraction"):
        restart_step(steps(4), fraction)


def test_restart_figures_cover_the_window_after_and_before():
    rows = [replace(BASE, policy="tiered", index=i, hit=i in (3, 4, 5), ttft_ms=10.0 * (i + 1),
                    cached_tokens=64 if i in (4, 5) else 0, restored=i == 4,
                    since_restart=None if i < 4 else i - 4) for i in range(8)]
    boots = {"tiered": {"tier_blocks": 12, "rewarm_seconds": 0.4}}
    f = restart_figures(rows, boots, window=2)["tiered"]
    assert f["queries_after"] == 2 and f["hit_rate_after"] == 1.0
    assert f["hit_rate_before"] == 0.5  # rows 2, 3: only the window before counts
    assert f["ttft_max_ms_after"] == 60.0 and f["restored_hits_after"] == 1
    assert f["cached_tokens_after"] == 128 and f["tier_blocks"] == 12
    table = restart_markdown({"tiered": f}, 2, 600.0)
    assert "10.0 simulated minutes (every worker, same disk); the first 2 queries" in table
    assert "| tiered | 12 | 0.4 | 50% | 100% |" in table


# -- seed 000's table --------------------------------------------------------------------------


def test_seed_rows_put_ours_beside_the_seeds_and_list_strategies_not_run():
    rows = [replace(BASE, ttft_ms=1000.0), replace(BASE, policy="tiered", ttft_ms=300.0,
                                                      mem_share=0.4, disk_share=1.5)]
    figures = summarize(rows, {"tiered": {"warmup_seconds": 2.5}}, ["none", "tiered"])
    table = seed_rows(figures)
    by = {r["policy"]: r for r in table}
    assert [r["policy"] for r in table][:2] == ["none", "tiered"]
    tiered = by["tiered"]
    assert tiered["strategy"] == "tiered KV cache" and tiered["p99_change"] == pytest.approx(-0.7)
    assert tiered["memory_share"] == 0.4 and tiered["disk_share"] == 1.5
    assert tiered["warmup_s"] == 2.5
    # The seed's row (DeepSeek-V2 7B on 4xA10G): 50% memory, -68% P99, 60 s warmup.
    assert tiered["seed_memory_share"] == [0.5, 0.5] and tiered["seed_p99_change"] == -0.68
    assert tiered["seed_warmup_s"] == 60
    assert by["none"]["strategy"] is None and by["none"]["seed_p99_change"] is None
    missing = {r["policy"] for r in table if not r["ran"]}
    assert missing == {"history", "hot-tokens", "synthetic", "hybrid"}
    assert by["history"]["seed_p99_change"] == -0.82 and by["history"]["p99_change"] is None


def test_seed_table_quotes_every_row_of_seed_000():
    quoted = {(s.policy, s.memory_text, s.p99_change, s.warmup_s) for s in SEED_000}
    assert quoted == {("history", "100%", -0.82, 120), ("hot-tokens", "15–20%", -0.65, 30),
                      ("synthetic", "<5%", -0.48, 5), ("hybrid", "30–40%", -0.73, 45),
                      ("tiered", "50%", -0.68, 60)}


def test_seed_markdown_shows_disk_apart_from_device_memory():
    rows = [replace(BASE, ttft_ms=1000.0), replace(BASE, policy="tiered", ttft_ms=300.0,
                                                      mem_share=0.4, disk_share=1.5)]
    text = seed_markdown(seed_rows(summarize(rows, {}, ["none", "tiered"])))
    lines = text.splitlines()
    assert lines[0].startswith("| strategy (seed 000) | policy | memory share | seed |")
    assert "| tiered KV cache | tiered | 40% + 150% disk | 50% | -70% | -68% | 0.0 | 60 |" in text
    assert "| batched synthetic requests | synthetic (not run) | - | <5% | - | -48% |" in text


def test_json_report_carries_the_seed_table_and_leaves_out_absent_sections():
    figures = summarize([BASE], {}, ["none"])
    report = json_report(figures, 1, 0, seed_table=seed_rows(figures), restart=None)
    assert report["seed_table"][0]["policy"] == "none" and "restart" not in report


# -- a simulated worker's restart ----------------------------------------------------------


def test_a_restarted_worker_has_lost_its_device_cache_but_keeps_its_counters():
    clock = SimClock()

    def engine() -> CostEngine:
        cache = make_cache(Budget(10**9, 1000, 10**9), clock, 16)
        return CostEngine(CostModel(100.0, 1.0), cache, model_id="m", kv_bytes_per_token=1)

    seen: list[str] = []
    worker = SimWorker(engine(), clock, worker_id="w", cache_requests=True)
    worker.listeners.append(lambda event: seen.append(event.kind))
    prompt = list(range(100))
    worker.serve(prompt, "t", [])
    assert worker.serve(prompt, "t", []).result.cached_tokens == 96
    runtime = worker.runtime
    worker.restart(engine())
    assert worker.restarts == 1 and len(worker.cache) == 0
    assert worker.expected_cached(prompt, "t") == 0
    assert worker.serve(prompt, "t", []).result.cached_tokens == 0
    assert worker.runtime is not runtime and worker.runtime.engine is worker.engine
    assert "stored" in seen  # the benchmark's listeners survive the restart
