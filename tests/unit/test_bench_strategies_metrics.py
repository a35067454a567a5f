"""Strategies figures from per-query rows, the policy map, the freshness check, the table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragwarm.bench.strategies.metrics import JSON_KEYS, json_report, percentile, summarize
from ragwarm.bench.strategies.policies import policy_class, policy_names
from ragwarm.bench.strategies.records import QueryRow, reuse_check
from ragwarm.bench.strategies.report import markdown_table, tables
from schemas import ChunkRef

H1, H2 = "a" * 64, "b" * 64


def row(
    policy: str,
    ttft: float,
    *,
    hit: bool = False,
    post: bool = False,
    stale: bool = False,
    cached: int = 0,
) -> QueryRow:
    return QueryRow(
        policy=policy,
        index=0,
        at=0.0,
        qid="q",
        burst=False,
        post_edit=post,
        repeat=True,
        ttft_ms=ttft,
        prompt_tokens=100,
        prefix_tokens=90,
        cached_tokens=cached,
        hit=hit,
        partial=False,
        stale=stale,
        outdated_partial=False,
        mem_share=0.5,
        pinned_share=0.1,
    )


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_lies_between_min_and_max(values, q):
    assert min(values) <= percentile(values, q) <= max(values)


def test_percentile_interpolates_like_numpy():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 20.0], 99) == pytest.approx(19.9)


def test_summarize_computes_rates_and_reductions():
    rows = [
        row("none", 1000.0),
        row("none", 1000.0),
        row("reactive", 100.0, hit=True, post=True, cached=80),
        row("reactive", 1000.0),
    ]
    figures = summarize(rows, {"reactive": {"warmup_seconds": 1.5}}, ["none", "reactive"])
    r = figures["reactive"]
    assert r["hit_rate"] == 0.5 and r["post_edit_hit_rate"] == 1.0 and r["queries"] == 2
    assert r["ttft_p50_ms"] == 550.0 and r["p50_reduction"] == 0.45
    assert r["warmup_seconds"] == 1.5 and r["stale_hits"] == 0
    assert figures["none"]["p99_reduction"] == 0.0 and r["p90_reduction"] is not None


def test_p90_is_reported_and_rates_without_queries_are_absent_not_zero():
    rows = [row("none", float(t)) for t in range(1, 11)] + [row("reactive", 7.0, hit=True)]
    figures = summarize(rows, {}, ["none", "reactive", "hybrid"])
    assert figures["none"]["ttft_p90_ms"] == pytest.approx(percentile(range(1, 11), 90))
    assert figures["none"]["post_edit_hit_rate"] is None  # no post-edit query behind it
    assert figures["none"]["hit_rate"] == 0.0  # ten queries, no hit: a real zero
    empty = figures["hybrid"]  # no rows at all
    assert empty["hit_rate"] is None and empty["ttft_p90_ms"] is None
    assert empty["p90_reduction"] is None and empty["cached_token_share"] is None
    report = json_report(figures, queries=11, kb_events=0, measurements=12)
    assert report["measurements"] == 12
    assert report["policies"]["none"]["post_edit_hit_rate"] is None
    table = markdown_table(figures)
    assert "TTFT p90 ms" in table and "| hybrid | - |" in table


def test_one_percentile_for_every_benchmark():
    from ragwarm.bench import pipeline_edits, stats
    from ragwarm.bench.strategies import metrics

    assert metrics.percentile is stats.percentile is pipeline_edits.percentile
    assert "interpolation" in (stats.percentile.__doc__ or "")


def test_json_report_has_exactly_the_contract_keys():
    figures = summarize([row("none", 5.0), row("hybrid", 1.0, stale=True)], {}, ["none", "hybrid"])
    report = json_report(figures, queries=1, kb_events=3)
    assert set(report) == {"policies", "queries", "kb_events"}
    assert set(report["policies"]["hybrid"]) == set(JSON_KEYS)
    assert report["policies"]["hybrid"]["stale_hits"] == 1
    assert isinstance(report["policies"]["none"]["stale_hits"], int)


def test_a_policy_s_own_figures_join_its_row_and_the_json_where_it_has_them():
    extras = {"synthetic": {"figures": {"synthetic_memory_share": 0.03,
                                        "synthetic_first_ask_hit_rate": 0.25}}}
    figures = summarize([row("none", 5.0), row("synthetic", 1.0)], extras, ["none", "synthetic"])
    assert figures["synthetic"]["synthetic_memory_share"] == 0.03
    report = json_report(figures, queries=1, kb_events=0)
    assert report["policies"]["synthetic"]["synthetic_first_ask_hit_rate"] == 0.25
    assert set(report["policies"]["none"]) == set(JSON_KEYS)


def test_policy_names_and_the_error_listing_them():
    assert policy_names() == [
        "none",
        "reactive",
        "scheduled",
        "history",
        "event-rag",
        "hot-tokens",
        "hybrid",
        "hybrid-noblend",
        "hybrid-chunks",
        "hybrid-blend",
        "tiered",
        "reactive-offload",
        "synthetic",
    ]
    assert policy_class("hybrid").name == "hybrid"
    blend = policy_class("hybrid-blend")
    assert blend.chunk_reuse and blend.chunk_warmup
    # The default blends (one switch); hybrid-noblend is it with blending off.
    assert policy_class("hybrid").chunk_reuse and not policy_class("hybrid").chunk_warmup
    assert not policy_class("hybrid-noblend").chunk_reuse
    chunks = policy_class("hybrid-chunks")
    assert chunks.chunk_warmup and not chunks.chunk_reuse  # exact reuse only: lossless
    with pytest.raises(ValueError, match="valid names: none, reactive, .*hybrid"):
        policy_class("lfu")


def test_only_none_skips_request_caching():
    # Warmup is added on top of the worker's own caching, never instead of it.
    caching = {n: policy_class(n).cache_requests for n in policy_names()}
    assert caching == {n: n != "none" for n in policy_names()}


SPANS = [
    (ChunkRef(chunk_id="d#0", content_hash=H1), 10, 50),
    (ChunkRef(chunk_id="d#1", content_hash=H1), 50, 90),
]


def test_reuse_check_flags_a_whole_outdated_chunk_as_stale():
    now = {"d#0": H1, "d#1": H2}
    entry = frozenset({("d#0", H1), ("d#1", H1)})
    assert reuse_check(entry, SPANS, 90, lambda ids: now) == (True, False)
    assert reuse_check(entry, SPANS, 60, lambda ids: now) == (False, True)
    assert reuse_check(entry, SPANS, 40, lambda ids: now) == (False, False)


def test_reuse_check_accepts_current_chunks_and_skips_the_store_for_misses():
    entry = frozenset({("d#0", H1), ("d#1", H1)})
    assert reuse_check(entry, SPANS, 90, lambda ids: {"d#0": H1, "d#1": H1}) == (False, False)

    def never(ids: list[str]) -> dict[str, str]:
        raise AssertionError("no reuse, no lookup")

    assert reuse_check(entry, SPANS, 0, never) == (False, False)


def test_markdown_table_lists_every_policy():
    figures = summarize(
        [row("none", 10.0), row("reactive", 5.0, hit=True)], {}, ["none", "reactive"]
    )
    table = markdown_table(figures).splitlines()
    assert table[0].startswith("| policy | TTFT mean ms | TTFT p50 ms")
    assert table[3].startswith("| reactive | 5 | 5 | -50% | 5 |")


def test_policy_notes_report_the_synthetic_share_and_first_ask_hits():
    from ragwarm.bench.strategies.report import policy_notes

    figures = {"reactive": {"hit_rate": 0.5},
               "synthetic": {"synthetic_memory_share": 0.021, "synthetic_memory_share_max": 0.048,
                             "synthetic_first_ask_hit_rate": 0.25, "synthetic_first_hits": 2,
                             "first_asks": 8}}
    [line] = policy_notes(figures)
    assert line.startswith("synthetic: synthetic prefixes held 2.1%")
    assert "at most 4.8%" in line and "25% (2 of 8)" in line


def test_first_asks_and_blended_answers_are_reported_per_policy():
    from dataclasses import replace

    first = replace(row("hybrid-blend", 100.0), repeat=False, blended_tokens=50,
                    first_token_agrees=True)
    wrong = replace(first, ttft_ms=300.0, first_token_agrees=False)
    again = row("hybrid-blend", 10.0, hit=True, cached=90)
    figures = summarize([first, wrong, again, replace(row("hybrid", 900.0), repeat=False)],
                        {}, ["hybrid", "hybrid-blend"])
    blend, hybrid = figures["hybrid-blend"], figures["hybrid"]
    assert (blend["first_ask_queries"], blend["first_ask_ttft_p50_ms"]) == (2, 200.0)
    assert blend["blended_queries"] == 2 and blend["blended_first_token_agreement"] == 0.5
    assert blend["blended_token_share"] == 0.5
    assert hybrid["blended_queries"] == 0 and hybrid["blended_first_token_agreement"] is None
    assert hybrid["first_ask_ttft_p50_ms"] == 900.0
    text = tables(figures)
    assert "first-ask TTFT p50 ms" in text and "| hybrid-blend | 2 | 200 |" in text


def test_tail_mean_is_the_mean_of_the_slowest_tenth() -> None:
    from ragwarm.bench.strategies.metrics import cvar

    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    assert cvar(values, 90) == 95.5  # mean of 91..100
    assert cvar([7.0], 90) == 7.0 and cvar([], 90) is None
    assert cvar([1.0, 2.0, 3.0], 90) == 3.0  # fewer than ten: the slowest one


def test_median_figures_over_runs() -> None:
    from ragwarm.bench.strategies.metrics import median_figures

    runs = [{"hybrid": {"ttft_p90_ms": v, "hit_rate": h, "note": n, "blend": b}}
            for v, h, n, b in ((100.0, 0.5, "a", None), (300.0, 0.7, "b", 1.0),
                               (200.0, 0.6, "c", None))]
    merged = median_figures(runs)["hybrid"]
    assert (merged["ttft_p90_ms"], merged["hit_rate"], merged["note"]) == (200.0, 0.6, "a")
    assert merged["blend"] == 1.0  # absent in some runs: the median of those that have it
