"""`ragwarm replay rag.queries --evaluate POLICY` against the real broker."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result
from kafka import KafkaProducer

from ragwarm.cli.replay import replay
from schemas import ChunkRef, QueryEvent, encode

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _query(i: int, version: str) -> QueryEvent:
    """Query i asks one question whose 4-block prefix is built from doc#0 at `version`."""
    chain = [f"{version}{b:031d}" for b in range(4)]
    return QueryEvent(
        question="How do I rotate certificates?", timestamp=T0 + timedelta(seconds=i),
        chunk_refs=[ChunkRef(chunk_id="doc#0", content_hash=version * 64)],
        prefix_hash=chain[-1], block_hashes=chain, prefix_tokens=64, prompt_tokens=80,
        cached_tokens=0 if i == 0 else 64, ttft_ms=900.0 if i == 0 else 100.0 + i,
    )


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@pytest.fixture
def queries(kafka_producer: KafkaProducer, new_topic: Callable[..., str]) -> str:
    """Six query events (the chunk changes before the last two) and one foreign record."""
    topic = new_topic("queries", partitions=2)
    for i in range(6):
        event = _query(i, "a" if i < 4 else "b")
        kafka_producer.send(topic, key=b"default", value=encode(event),
                            timestamp_ms=_ms(event.timestamp))
    kafka_producer.send(topic, key=b"default", value=b'{"not": "a query"}',
                        timestamp_ms=_ms(T0 + timedelta(seconds=10)))
    kafka_producer.flush(timeout=30)
    return topic


def _evaluate(bootstrap: str, topic: str, *args: str) -> Result:
    env = {"RAGWARM_KAFKA_BOOTSTRAP": bootstrap}
    return CliRunner().invoke(replay, [topic, *args], env=env, catch_exceptions=False)


def test_reactive_and_event_rag_on_a_logged_stream(kafka_bootstrap: str, queries: str) -> None:
    reactive = _evaluate(kafka_bootstrap, queries, "--from", "beginning", "--evaluate",
                         "reactive", "--json")
    assert reactive.exit_code == 0, reactive.output
    got = json.loads(reactive.stdout)
    assert got["queries"] == 6 and got["rejected"] == 1 and got["policy"] == "reactive"
    # Misses: the first query, and the first one after the chunk changed.
    assert got["hit_rate"] == pytest.approx(4 / 6, abs=1e-4)
    assert got["cost_model"]["fitted_on"] == 6
    assert got["logged_ttft_p50_ms"] is not None

    # The benchmark's event-rag: the log stands for yesterday, so the ready worker gets the
    # prefix at once, and the chunk change re-warms the question before it is asked again.
    event_rag = json.loads(_evaluate(kafka_bootstrap, queries, "--from", "beginning",
                                     "--evaluate", "event-rag", "--json").stdout)
    assert event_rag["hit_rate"] == 1.0
    assert event_rag["cached_token_share"] > got["cached_token_share"]
    # A log holds no KB events: the change is seen from the ask that reveals it, so its
    # re-warm starts then and, as warmups now cost the worker's time, that ask waits for it
    # (as long as reactive's miss). The tail can tie; it is never worse.
    assert event_rag["est_ttft_p99_ms"] <= got["est_ttft_p99_ms"]
    assert event_rag["est_ttft_p90_ms"] is not None


def test_a_time_range_and_the_text_report(kafka_bootstrap: str, queries: str) -> None:
    late = (T0 + timedelta(seconds=2)).isoformat()
    result = _evaluate(kafka_bootstrap, queries, "--from", late, "--evaluate", "none")
    assert result.exit_code == 0, result.output
    assert "4 query events" in result.output and "hit rate 0.0%" in result.output
    # One uncached size only (16 tokens each): nothing to fit a slope to.
    assert "default figures" in result.output
    early = (T0 + timedelta(seconds=3)).isoformat()
    result = _evaluate(kafka_bootstrap, queries, "--from", "beginning", "--to", early,
                       "--evaluate", "reactive")
    assert "3 query events" in result.output and "fitted on 3 logged TTFTs" in result.output


def test_unknown_policy_and_conflicting_options(kafka_bootstrap: str, queries: str) -> None:
    bad = _evaluate(kafka_bootstrap, queries, "--from", "beginning", "--evaluate", "lru")
    assert bad.exit_code == 2 and "valid names: none, reactive" in bad.output
    both = _evaluate(kafka_bootstrap, queries, "--from", "beginning", "--evaluate", "none",
                     "--group", "g")
    assert both.exit_code == 2 and "--evaluate only reads" in both.output
