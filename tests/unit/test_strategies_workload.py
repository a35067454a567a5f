"""The strategies workload: popularity, arrivals, the shared clock, slices of a trace."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rag.trace import Question, TraceEvent
from ragwarm.bench.strategies import workload as wl

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def ev(seq: int, doc: str, minute: int = 0, initial: bool = False) -> TraceEvent:
    meta = {"initial": True} if initial else {}
    return TraceEvent(
        seq=seq,
        timestamp=T0 + timedelta(minutes=minute),
        op="upsert",
        doc_id=doc,
        text=f"{doc} v{seq}",
        metadata=meta,
    )


def q(
    qid: str, doc: str | None = None, first: int | None = None, removed: int | None = None
) -> Question:
    return Question(
        qid=qid, question=f"what about {qid}?", doc_id=doc, first_seq=first, removed_seq=removed
    )


def test_zipf_weights_rank_the_shuffled_questions():
    weights = wl.zipf_weights(["a", "b", "c", "d"], 1.0, random.Random(1))
    assert sorted(weights.values(), reverse=True) == [1.0, 1 / 2, 1 / 3, 1 / 4]
    assert weights == wl.zipf_weights(["a", "b", "c", "d"], 1.0, random.Random(1))


def test_arrivals_are_ordered_and_counted():
    got = wl.arrivals(200, random.Random(3), 30.0, 0.2, (3, 5), 1.0)
    assert len(got) == 200
    assert all(a.at <= b.at for a, b in zip(got, got[1:], strict=False))
    assert any(a.burst for a in got) and not all(a.burst for a in got)


def test_edit_times_keep_a_commit_together_and_spread_commits():
    events = [ev(1, "a", 0), ev(2, "b", 0), ev(3, "a", 500), ev(4, "c", 100000)]
    times = wl.edit_times(events, 0.0, 300.0)
    assert times[0] == times[1]
    assert times == [50.0, 50.0, 150.0, 250.0]


def test_timeline_only_asks_live_questions():
    questions = [q("old", removed=3), q("new", first=3), q("always")]
    weights = {"old": 1.0, "new": 1.0, "always": 1.0}
    arrivals = [wl.Arrival(float(t)) for t in range(1, 101)]
    steps = wl.timeline(arrivals, [ev(3, "x")], questions, weights, 2, random.Random(0), 0.5)
    edit_at = next(s.at for s in steps if isinstance(s, wl.KbStep))
    for step in steps:
        if isinstance(step, wl.QueryStep):
            assert step.question.qid != ("old" if step.at >= edit_at else "new")


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), n_edits=st.integers(0, 8), seed=st.integers(0, 10**6))
def test_timeline_keeps_every_edit_in_order_and_every_query(n, n_edits, seed):
    rng = random.Random(seed)
    questions = [q(f"q{i}") for i in range(5)]
    weights = wl.zipf_weights([x.qid for x in questions], 1.1, rng)
    arrivals = wl.arrivals(n, rng, 10.0, 0.1, (2, 4), 1.0)
    edits = [ev(10 + i, f"d{i % 3}", i) for i in range(n_edits)]
    steps = wl.timeline(arrivals, edits, questions, weights, 9, rng)
    assert [s.event for s in steps if isinstance(s, wl.KbStep)] == edits
    assert [s.index for s in steps if isinstance(s, wl.QueryStep)] == list(range(n))
    assert all(a.at <= b.at for a, b in zip(steps, steps[1:], strict=False))


def test_relevant_edits_take_the_first_n_touching_the_docs():
    events = [ev(1, "a"), ev(2, "x"), ev(3, "b"), ev(4, "a")]
    assert [e.seq for e in wl.relevant_edits(events, {"a", "b"}, 2)] == [1, 3]
    assert wl.relevant_edits(events, {"a"}, None) == events


def test_split_trace_uses_initial_marks_or_the_first_repeat():
    marked = [ev(1, "a", initial=True), ev(2, "b", initial=True), ev(3, "a")]
    assert [len(p) for p in wl.split_trace(marked)] == [2, 1]
    plain = [ev(1, "a"), ev(2, "b"), ev(3, "a"), ev(4, "c")]
    initial, rest = wl.split_trace(plain)
    assert [e.seq for e in initial] == [1, 2] and [e.seq for e in rest] == [3, 4]


def test_kb_slice_keeps_named_documents_first():
    initial = [ev(i, f"d{i}", initial=True) for i in range(10)]
    cut = wl.kb_slice(initial, [q("a", "d7"), q("b", "d2")], 4, random.Random(0))
    docs = [e.doc_id for e in cut]
    assert len(cut) == 4 and {"d7", "d2"} <= set(docs)
    assert [e.seq for e in cut] == sorted(e.seq for e in cut)
    assert wl.kb_slice(initial, [], None, random.Random(0)) == initial


def test_past_log_ranks_by_popularity():
    questions = [q("a"), q("b"), q("c", removed=0)]
    log = wl.past_log(questions, {"a": 10.0, "b": 1.0, "c": 100.0}, 5, 300, random.Random(2))
    assert {x.qid for x in log} <= {"a", "b"}
    assert [x.qid for x in wl.by_popularity(log)][0] == "a"
