"""Offline what-if replay of logged queries: cost model and each policy's cache decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ragwarm.bench.strategies.offline import CostModel, evaluate, fit_cost, summary
from schemas import ChunkRef, QueryEvent

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


def hit_rates(events: list[QueryEvent], policy: str) -> list[bool]:
    outcomes, _ = evaluate(events, policy, kv_bytes=10**9, bytes_per_token=PER_TOKEN)
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
    assert hit_rates(events, "event-rag") == [False, True, True]


def test_history_starts_with_the_most_asked_prefixes():
    events = [query(0, "a?", "a"), query(1, "b?", "a"), query(2, "a?", "a")]
    assert hit_rates(events, "history")[0] is True


def test_estimates_follow_the_cost_model():
    events = [query(i, "a?", "a") for i in range(2)]
    outcomes, cost = evaluate(events, "reactive", 10**9, PER_TOKEN, CostModel(100.0, 1.0))
    assert [o.ttft_ms for o in outcomes] == [180.0, 116.0]
    report = summary(outcomes, cost)
    assert report["hit_rate"] == 0.5 and report["est_ttft_p50_ms"] == 148.0


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(ValueError, match="valid names: none, reactive"):
        evaluate([], "lru", 10, 1)
