"""The strategies workload: popularity, arrivals, the shared clock, slices of a trace."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ragwarm.bench.strategies import workload as wl
from ragwarm.trace import Question, TraceEvent

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


def _post_edit_asks(steps: list, deps: dict[str, frozenset[str]]) -> list[tuple[int, str]]:
    """(edit position, qid) of each question asked before an edit to one of its documents
    and again after it."""
    found = []
    for i, step in enumerate(steps):
        if isinstance(step, wl.KbStep):
            doc = step.event.doc_id
            before = {s.question.qid for s in steps[:i]
                      if isinstance(s, wl.QueryStep) and doc in deps[s.question.qid]}
            after = {s.question.qid for s in steps[i + 1:] if isinstance(s, wl.QueryStep)}
            found += [(i, qid) for qid in sorted(before & after)]
    return found


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n_edits=st.integers(1, 12))
def test_a_question_asked_before_an_edit_to_its_document_is_asked_after_it(seed, n_edits):
    rng = random.Random(seed)
    questions = [q(f"q{i}", f"d{i}") for i in range(30)]
    weights = wl.zipf_weights([x.qid for x in questions], 1.1, rng)
    arrivals = wl.arrivals(72, rng, 30.0, 0.08, (3, 8), 2.0)
    edits = [ev(100 + i, f"d{rng.randrange(30)}", i) for i in range(n_edits)]
    steps = wl.timeline(arrivals, edits, questions, weights, 99, random.Random(seed))
    deps = {x.qid: x.answer_docs for x in questions}
    for i, step in enumerate(steps):
        if not isinstance(step, wl.KbStep):
            continue
        doc = step.event.doc_id
        before = {s.question.qid for s in steps[:i]
                  if isinstance(s, wl.QueryStep) and doc in deps[s.question.qid]}
        after = [s.question.qid for s in steps[i + 1:] if isinstance(s, wl.QueryStep)]
        assert before, "an edited document gets a question asked before the edit"
        if len(after) > 2 * n_edits:  # room for every edit's asks (one question per doc)
            assert before <= set(after)
    # Same arrivals, same edits, same seed: the same timeline (every policy sees it).
    again = wl.timeline(arrivals, edits, questions, weights, 99, random.Random(seed))
    assert again == steps


def test_post_edit_asks_use_the_retrieval_dependencies_and_respect_liveness():
    questions = [q("a", "d0"), q("b", "d1", removed=101)]
    weights = {"a": 1.0, "b": 1.0}
    arrivals = [wl.Arrival(float(t)) for t in range(1, 41)]
    edits = [ev(100, "d9", 0), ev(101, "d1", 1)]
    deps = {"a": frozenset({"d0", "d9"}), "b": frozenset({"d1"})}
    steps = wl.timeline(arrivals, edits, questions, weights, 99, random.Random(4), 0.5, deps)
    asks = _post_edit_asks(steps, {"a": deps["a"], "b": deps["b"]})
    assert any(qid == "a" for _, qid in asks)  # d9 is only retrieved by "a", not named
    edit_b = next(i for i, s in enumerate(steps)
                  if isinstance(s, wl.KbStep) and s.event.seq == 101)
    assert all(s.question.qid != "b" for s in steps[edit_b:] if isinstance(s, wl.QueryStep))


def test_relevant_edits_count_only_content_changes():
    initial = [ev(0, "a", initial=True)]
    same = TraceEvent(seq=1, timestamp=T0, op="upsert", doc_id="a", text="a v0")
    events = [same, ev(2, "a"), ev(3, "x"), ev(4, "a")]
    assert [e.seq for e in wl.relevant_edits(events, {"a"}, 1, initial)] == [1, 2]
    assert [e.seq for e in wl.content_changes(initial, events)] == [2, 3, 4]


def test_questions_are_sampled_first_and_their_documents_bound_the_slice():
    questions = [q(f"q{i}", f"d{i}") for i in range(3900)]
    edited = {f"d{i}" for i in range(0, 3900, 7)}
    picked = wl.sample_questions(questions, edited, 40, 50, random.Random(1))
    assert len(picked) == 40 and len({x.qid for x in picked}) == 40
    assert sum(bool(x.answer_docs & edited) for x in picked) >= 20
    assert picked == wl.sample_questions(questions, edited, 40, 50, random.Random(1))
    initial = [ev(i, f"d{i}", initial=True) for i in range(3900)]
    cut = wl.kb_slice(initial, picked, 50, random.Random(0))
    assert len(cut) == 50 and {d for x in picked for d in x.answer_docs} <= {e.doc_id for e in cut}
    few = wl.sample_questions(questions, edited, 40, 10, random.Random(1))
    assert len({d for x in few for d in x.answer_docs}) <= 10


def test_modes_size_the_workload():
    from ragwarm.bench.strategies.command import _plan
    from ragwarm.bench.strategies.settings import StrategySettings

    s = StrategySettings()
    quick, standard, full = (_plan(s, m, None, None) for m in ("quick", "standard", "full"))
    assert quick["sample"] == 40 and quick["docs"] == 50 and quick["queries"] == 72
    assert standard["docs"] is None and standard["sample"] is None
    assert standard["queries"] >= 240 and standard["edits"] >= 30
    assert full["queries"] == 600 and full["edits"] is None
    from rag.settings import RagSettings

    assert standard["chunk_tokens"] == RagSettings().chunk_tokens
    # Only --standard reuses a measurement across queries; quick and full measure each ask.
    assert standard["share_queries"] and not quick["share_queries"]
    assert not full["share_queries"]
    off = StrategySettings(standard_share_queries=False)
    assert not _plan(off, "standard", None, None)["share_queries"]


def test_the_default_full_mode_says_what_it_costs_before_it_starts():
    from ragwarm.bench.strategies.command import _plan, full_mode_notice
    from ragwarm.bench.strategies.settings import StrategySettings

    s = StrategySettings()
    full = _plan(s, "full", None, None)
    notice = full_mode_notice(full, 11)
    assert notice is not None
    assert "600 queries" in notice and "11 policies" in notice and "hours" in notice
    assert "--standard" in notice and "--model-free" in notice
    assert "40 KB changes" in (full_mode_notice(_plan(s, "full", None, 40), 3) or "")
    assert full_mode_notice(full | {"model_free": True}, 11) is None
    for mode in ("quick", "standard"):
        assert full_mode_notice(_plan(s, mode, None, None), 11) is None


def test_memory_share_is_an_option_refused_outside_its_range(tmp_path):
    """`--memory-share` sets every policy's budget; zero, a negative share or more than 4x
    the prefixes is refused by name before any work starts."""
    from click.testing import CliRunner

    from ragwarm.bench.strategies.command import strategies

    events, questions = tmp_path / "events.jsonl", tmp_path / "questions.jsonl"
    events.write_text("")
    questions.write_text("")
    base = ["--events", str(events), "--questions", str(questions), "--out", str(tmp_path)]
    for bad in ("0", "-0.2", "4.5", "half"):
        result = CliRunner().invoke(strategies, [*base, "--memory-share", bad])
        assert result.exit_code == 2 and "--memory-share" in result.output, result.output
