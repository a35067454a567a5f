"""`bench faults`' pure parts: the slice, the fault plan, the oracle and the accounting."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragwarm.bench import faults_plan as plan
from ragwarm.trace import Question, TraceEvent

T = datetime(2024, 1, 1, tzinfo=UTC)


def ev(seq: int, doc: str, text: str | None = "x", initial: bool = False,
       op: str = "upsert") -> TraceEvent:
    return TraceEvent(seq=seq, timestamp=T, op=op, doc_id=doc,
                      text=None if op == "delete" else text, metadata={"initial": initial})


def words(doc_id: str, text: str) -> dict[str, str]:
    """A stand-in chunker: one chunk per line, hashed by its text."""
    return {f"{doc_id}#{i}": line for i, line in enumerate(text.splitlines())}


TRACE = [
    ev(0, "a.md", "a0", True), ev(1, "b.md", "b0", True), ev(2, "c.md", "c0", True),
    ev(3, "c.md", "c1"), ev(4, "a.md", "a1\nmore"), ev(5, "new.md", "n0"),
    ev(6, "b.md", op="delete"), ev(7, "big.md", "y" * 50),
]
QUESTIONS = [Question(qid="q1", question="What is b?", doc_id="b.md"),
             Question(qid="q2", question="Later", doc_id="new.md", first_seq=5)]


def test_the_slice_prefers_answering_docs_then_those_edited_first_and_drops_oversize():
    s = plan.pick_slice(TRACE, QUESTIONS, docs=2, edits=10, max_bytes=20)
    assert [e.doc_id for e in s.initial] == ["b.md", "c.md"]
    assert [e.seq for e in s.edits] == [3, 6]
    assert [q.qid for q in s.questions] == ["q1"]  # q2 is not live at the initial state


def test_docs_zero_takes_every_document_and_edits_limit_the_replay():
    s = plan.pick_slice(TRACE, QUESTIONS, docs=0, edits=3, max_bytes=10_000)
    assert [e.doc_id for e in s.initial] == ["a.md", "b.md", "c.md"]
    assert [e.seq for e in s.edits] == [3, 4, 5]


def test_the_oracle_is_the_last_event_of_each_document_deletes_included():
    expected = plan.oracle(TRACE)
    assert expected["a.md"] == plan.Expected(4, False, "a1\nmore")
    assert expected["b.md"].deleted and expected["b.md"].version == 6
    assert plan.current_chunks(expected, words) == {
        "a.md#0": "a1", "a.md#1": "more", "c.md#0": "c1", "new.md#0": "n0", "big.md#0": "y" * 50,
    }


def test_versions_indexed_needs_the_version_the_delete_flag_and_the_exact_chunks():
    expected = plan.oracle(TRACE[:7])
    index = {
        "a.md": plan.IndexedDoc(4, False, {"a.md#0": "a1", "a.md#1": "more"}),
        "b.md": plan.IndexedDoc(6, True, {}),
        "c.md": plan.IndexedDoc(3, False, {"c.md#0": "c0"}),  # right version, old chunk
        "new.md": plan.IndexedDoc(4, False, {"new.md#0": "n0"}),  # version behind
    }
    assert plan.versions_indexed(expected, index, words) == 2
    index["c.md"] = plan.IndexedDoc(3, False, {"c.md#0": "c1"})
    index["new.md"] = plan.IndexedDoc(5, False, {"new.md#0": "n0"})
    assert plan.versions_indexed(expected, index, words) == 4


def test_a_held_entry_with_any_old_chunk_is_a_lost_invalidation():
    current = {"a#0": "h1", "a#1": "h2"}
    held = [
        {"chunk_refs": [{"chunk_id": "a#0", "content_hash": "h1"}]},
        {"chunk_refs": [{"chunk_id": "a#0", "content_hash": "h1"},
                        {"chunk_id": "a#1", "content_hash": "old"}]},
        {"chunk_refs": [{"chunk_id": "gone#0", "content_hash": "h"}]},
        {"chunk_refs": []},
    ]
    assert plan.lost_invalidations(held, current) == 2


def test_stale_needs_a_cache_hit_on_a_chunk_older_than_the_table_said():
    old = plan.Asked((("a", 3), ("b", 9)), {"a": 4, "b": 9}, cached_tokens=512)
    assert plan.stale(old)
    assert not plan.stale(plan.Asked(old.chunk_versions, old.table_versions, 0))
    assert not plan.stale(plan.Asked((("a", 4),), {"a": 4}, 512))
    assert not plan.stale(plan.Asked((("z", 1),), {}, 512))  # a doc the table has not yet


@given(st.integers(1, 200), st.integers(0, 12), st.integers())
def test_the_plan_has_every_fault_once_but_kills_in_edit_order(n, kills, seed):
    faults = plan.plan_faults(n, kills, seed)
    assert faults == plan.plan_faults(n, kills, seed)
    assert all(0 <= f.after_edit < n for f in faults)
    assert [f.after_edit for f in faults] == sorted(f.after_edit for f in faults)
    counts = plan.fault_counts(f.kind for f in faults)
    assert counts == {"streams_kills": kills, "worker_kills": 1, "broker_restarts": 1,
                      "store_outages": 1, "host_moves": 1 if kills else 0}
    (worker,) = [f for f in faults if f.kind == plan.WORKER_KILL]
    assert worker.after_edit >= n // 2


def test_no_edits_no_plan():
    with pytest.raises(ValueError, match="at least one edit"):
        plan.plan_faults(0, 5, 1)


def test_recovery_figures_and_the_checks():
    assert plan.recovery_figures([3.0, 10.0, 5.0]) == {"streams_recovery_s_p50": 5.0,
                                                       "streams_recovery_s_max": 10.0}
    ok = {"kb_versions_expected": 3, "kb_versions_indexed": 3, "lost_invalidations": 0,
          "stale_served": 0, "transient_dead_letters": 0, "worker_rewarm_s": 12.0}
    assert plan.passed(ok) == []
    bad = ok | {"kb_versions_indexed": 2, "stale_served": 1, "worker_rewarm_s": None}
    assert len(plan.passed(bad)) == 3
    planned = plan.plan_faults(10, 2, seed=4)
    done = ok | {"faults": plan.fault_counts(f.kind for f in planned)}
    assert plan.passed(done, planned) == []
    short = done | {"faults": plan.fault_counts(f.kind for f in planned[:-1])}
    assert plan.passed(short, planned) == [f"faults injected {short['faults']} differ from "
                                           "the plan"]


def test_outage_figures_count_what_was_answered_and_failed_while_each_fault_lasted():
    outages = [plan.Outage(plan.STREAMS_KILL, 10.0, 70.0),
               plan.Outage(plan.WORKER_KILL, 100.0, 120.0)]
    asked = [plan.Asked((), {}, 0, at, ttft) for at, ttft in
             [(5.0, 50.0), (20.0, 300.0), (40.0, 500.0), (110.0, 900.0), (130.0, 60.0)]]
    figures = plan.outage_figures(outages, asked, failed_at=[30.0, 80.0])
    assert figures["answered_during_outage"] == 3 and figures["errors_during_outage"] == 1
    assert figures["outage_ttft_p50_ms"] == 500.0  # the median of 300, 500 and 900
    assert figures["ttft_p50_ms"] == 300.0  # every answer's, to compare with
    assert figures["outages"] == [
        {"kind": plan.STREAMS_KILL, "seconds": 60.0, "answered": 2, "errors": 1,
         "ttft_p50_ms": 400.0},
        {"kind": plan.WORKER_KILL, "seconds": 20.0, "answered": 1, "errors": 0,
         "ttft_p50_ms": 900.0},
    ]
    none = plan.outage_figures([], asked, [])
    assert (none["answered_during_outage"], none["outage_ttft_p50_ms"]) == (0, None)


def test_recovery_phases_are_the_seconds_in_each_state_of_the_ready_probe():
    first = [(0.0, "down"), (2.5, "recovering tables"), (63.0, "re-indexing 3 documents from "
             "kb.changes"), (64.0, "ready")]
    second = [(0.0, "down"), (3.5, "recovering tables"), (60.0, "ready")]
    assert plan.phase_seconds(first) == {"down": 2.5, "recovering tables": 60.5,
                                         "re-indexing N documents from kb.changes": 1.0}
    assert plan.phase_figures([first, second]) == {
        "down": 3.0, "recovering tables": 58.5, "re-indexing N documents from kb.changes": 0.5}


def test_log_marks_are_seconds_after_the_kill_of_the_first_line_of_each_kind():
    from datetime import datetime

    kill = datetime(2026, 12, 3, 17, 0, 0).timestamp()
    lines = ["streams: app faults on 127.0.0.1:9092 (no timestamp: not a mark)",
             "[2026-12-03 17:00:21,500] [7] [INFO]: [^Worker]: Starting... ",
             "[2026-12-03 17:00:32,000] [7] [INFO]: Joined group 'faults' (generation 3) ",
             "[2026-12-03 17:00:33,000] [7] [INFO]: [^---Recovery]: Resuming flow... ",
             "[2026-12-03 17:00:34,000] [7] [INFO]: [^---Recovery]: Resuming flow... ",
             "[2026-12-03 17:00:35,200] [7] [INFO]: [^Worker]: Ready "]
    marks = plan.log_marks(lines, kill)
    assert marks == {"log starts": 21.5, "group joined": 32.0, "tables recovered": 33.0,
                     "faust ready": 35.2}
    assert plan.mark_figures([marks, {"log starts": 20.5}]) == {
        "log starts": 21.0, "group joined": 32.0, "tables recovered": 33.0, "faust ready": 35.2}
