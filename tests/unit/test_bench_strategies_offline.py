"""Offline what-if replay of logged queries: cost model and each policy's cache decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ragwarm.bench.strategies.offline import evaluate, summary
from ragwarm.bench.strategies.settings import StrategySettings
from schemas import ChunkRef, QueryEvent
from workers.cost_engine import CostModel, fit_cost

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PER_TOKEN = 1000


def query(
    i: int, question: str, version: str, ttft: float | None = 500.0, cached: int = 0
) -> QueryEvent:
    """A query whose 4-block prefix is built from chunk `doc#0` at `version`."""
    digest = (version * 64)[:64]
    chain = [f"{version}{question[:1]}{b:030d}" for b in range(4)]
    return QueryEvent(
        question=question,
        timestamp=T0 + timedelta(seconds=10 * i),
        chunk_refs=[ChunkRef(chunk_id="doc#0", content_hash=digest)],
        prefix_hash=chain[-1],
        block_hashes=chain,
        prefix_tokens=64,
        prompt_tokens=80,
        cached_tokens=cached,
        ttft_ms=ttft,
    )


def settings() -> StrategySettings:
    return StrategySettings.model_validate(
        {"streams": {"kv_bytes_per_token": PER_TOKEN}}
    )


def hit_rates(events: list[QueryEvent], policy: str) -> list[bool]:
    outcomes, _, _ = evaluate(events, policy, settings(), kv_bytes=10**9)
    return [o.hit for o in outcomes]


def test_fit_cost_recovers_a_line_and_falls_back_without_data():
    events = [
        query(0, "a?", "a", ttft=10 + 2 * 80),
        query(1, "a?", "a", ttft=10 + 2 * 16, cached=64),
    ]
    cost = fit_cost(events)
    assert cost.fixed_ms == pytest.approx(10) and cost.per_token_ms == pytest.approx(2)
    assert cost.fitted_on == 2
    assert fit_cost([query(0, "a?", "a", ttft=None)]).fitted_on == 0


def test_none_never_hits_and_reactive_hits_repeats():
    events = [query(i, "a?", "a") for i in range(3)]
    assert hit_rates(events, "none") == [False, False, False]
    assert hit_rates(events, "reactive") == [False, True, True]


def test_event_rag_rewarms_a_question_whose_chunk_changed():
    events = [query(0, "a?", "a"), query(1, "a?", "a"), query(2, "a?", "b")]
    assert hit_rates(events, "reactive")[2] is False
    # The log stands for yesterday too: the app tracked the prefix, and warms it on ready.
    assert hit_rates(events, "event-rag") == [True, True, True]
    changed = [query(0, "b?", "a"), query(1, "a?", "a"), query(2, "a?", "a"),
               query(3, "a?", "b")]
    assert hit_rates(changed, "event-rag")[3] is True  # re-warmed when the chunk changed


def test_every_policy_evicts_as_ragwarms_worker_unless_the_peers_keep_their_own():
    events = [query(0, "a?", "a")]
    for policy in ("reactive", "history", "event-rag", "hybrid"):
        _, _, lane = evaluate(events, policy, settings(), 10**9)
        assert lane.worker.cache.policy_name == "slru"
    _, _, lane = evaluate(events, "reactive", settings(), 10**9, eviction="gdsf")
    assert lane.worker.cache.policy_name == "gdsf"
    own = settings().model_copy(update={"same_eviction": False})
    expected = {"reactive": "lru", "history": "lru", "event-rag": "slru", "hybrid": "slru"}
    for policy, eviction in expected.items():
        _, _, lane = evaluate(events, policy, own, 10**9)
        assert lane.worker.cache.policy_name == eviction
    _, _, lane = evaluate(events, "reactive", own, 10**9, eviction="gdsf")
    assert lane.worker.cache.policy_name == "lru"  # vLLM's, whatever ragwarm's worker does


def test_history_starts_with_the_most_asked_prefixes():
    events = [query(0, "a?", "a"), query(1, "b?", "a"), query(2, "a?", "a")]
    assert hit_rates(events, "history")[0] is True


def test_estimates_follow_the_cost_model():
    events = [query(i, "a?", "a") for i in range(2)]
    outcomes, cost, _ = evaluate(events, "reactive", settings(), 10**9, CostModel(100.0, 1.0))
    # The repeat reuses every full block of its prompt (the question's too), like the
    # worker's request caching: 80 prompt tokens, the last one always computed.
    assert [o.ttft_ms for o in outcomes] == [180.0, 101.0]
    report = summary(outcomes, cost)
    assert report["hit_rate"] == 0.5 and report["est_ttft_p50_ms"] == 140.5
    assert summary([], cost)["hit_rate"] is None


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(ValueError, match="valid names: none, reactive"):
        evaluate([], "lru", settings(), 10)


def test_hybrid_hits_at_least_what_reactive_hits():
    events = [query(i, q, "a" if i < 6 else "b") for i, q in enumerate("abacabadabac")]
    reactive, hybrid = hit_rates(events, "reactive"), hit_rates(events, "hybrid")
    assert all(h for r, h in zip(reactive, hybrid, strict=True) if r)
    assert sum(hybrid) > sum(reactive)


def test_a_streams_setting_reaches_both_the_benchmark_and_the_offline_policies(monkeypatch):
    """One settings object: the TTL of RAGWARM_STREAMS_* is what event-rag's prefills carry
    in `replay --evaluate` and in `bench strategies` (both open lanes with `open_lane`)."""
    from pathlib import Path

    from ragwarm.bench.strategies import lanes

    monkeypatch.setenv("RAGWARM_STREAMS_PREFIX_TTL_S", "123")
    monkeypatch.setenv("RAGWARM_STREAMS_HOT_TICK_S", "7")
    s = StrategySettings()
    assert s.streams.prefix_ttl_s == 123.0
    events = [query(i, "a?", "a") for i in range(3)]
    _, _, lane = evaluate(events, "event-rag", s, 10**9)
    pipeline = lane.policy.pipeline  # type: ignore[attr-defined]
    assert pipeline.settings.prefix_ttl_s == 123.0 and pipeline.settings.hot_tick_s == 7.0
    entries = list(lane.worker.cache.entries())
    assert any(e.expires_at == pytest.approx(e.created_at + 123.0) for e in entries)
    # The benchmark builds its lanes the same way (read, not imported: it loads torch).
    assert "open_lane(policy_class(name)" in Path(lanes.__file__).with_name("runner.py").read_text()
