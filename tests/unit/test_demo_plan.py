"""The demo's pure parts: edit slice and questions, changed chunks, summaries, table, chart."""

from __future__ import annotations

from datetime import UTC, datetime

from ragwarm.stack.demo_plan import (
    Row,
    after_edit_state,
    changed_chunks,
    held,
    plan_demo,
    rewarm_targets,
    rewarm_verdict,
    round_robin,
    summarize,
    table_lines,
    write_chart,
)
from ragwarm.trace import Question, TraceEvent

T = datetime(2024, 1, 1, tzinfo=UTC)


def event(seq: int, doc: str, text: str | None, initial: bool, op: str = "upsert") -> TraceEvent:
    return TraceEvent(
        seq=seq, timestamp=T, op=op, doc_id=doc, text=text, metadata={"initial": initial}
    )


def question(qid: str, doc: str, first_seq: int = 0) -> Question:
    return Question(qid=qid, question=f"about {doc}?", doc_id=doc, first_seq=first_seq)


EVENTS = [
    event(0, "a.md", "A0", True),
    event(1, "b.md", "B0", True),
    event(2, "c.md", "C0", True),
    event(3, "z.md", "Z1", False),  # no question asks about z.md
    event(4, "b.md", "B1", False),
    event(5, "a.md", "A1", False),
    event(6, "b.md", "B2", False),
]
QUESTIONS = [
    question("q1", "a.md"),
    question("q2", "a.md"),
    question("q3", "b.md"),
    question("q4", "c.md"),
    question("q5", "b.md", first_seq=6),
]


def test_plan_takes_the_first_edits_of_asked_documents_and_their_live_questions():
    plan = plan_demo(EVENTS, QUESTIONS, n_edits=2)
    assert [e.seq for e in plan.initial] == [0, 1, 2]
    assert [e.seq for e in plan.edits] == [4, 5]  # z.md is skipped: nobody asks about it
    # Round-robin over the edited documents in edit order; q5 is not live yet, c.md not edited.
    assert [q.qid for q in plan.questions] == ["q3", "q1", "q2"]


def test_round_robin_alternates_groups_and_drops_repeats():
    a, b, c = question("a", "x"), question("b", "y"), question("c", "y")
    assert [q.qid for q in round_robin([[a], [b, c], [a]])] == ["a", "b", "c"]
    assert round_robin([]) == []


def paragraphs(doc_id: str, text: str) -> dict[str, str]:
    """A stand-in chunker: one chunk per line, hashed by its text."""
    return {f"{doc_id}#{i}": line for i, line in enumerate(text.split("|")) if line}


def test_changed_chunks_follow_the_edits_in_order():
    initial = [event(0, "a.md", "x|y|z", True), event(1, "b.md", "p|q", True)]
    edits = [
        event(2, "a.md", "x|Y|z", False),
        event(3, "a.md", "x|Y", False),
        event(4, "b.md", None, False, op="delete"),
    ]
    assert changed_chunks(initial, edits, paragraphs) == {"a.md#1", "a.md#2", "b.md#0", "b.md#1"}
    assert changed_chunks(initial, edits[:1], paragraphs) == {"a.md#1"}
    # An edit that only appends a chunk changes none of the existing ones.
    assert changed_chunks(initial, [event(5, "a.md", "x|y|z|w", False)], paragraphs) == set()


def row(
    q: str, phase: str, ttft: float, cached: int, prefix: str = "p1", prefix_tokens: int = 100
) -> Row:
    return Row(q, phase, ttft, cached, 120, None, 0.0, prefix, prefix_tokens, "w1")


def test_summaries_take_medians_and_say_what_became_of_the_prefix():
    rows = [
        row("q", "cold", 900, 0),
        row("q", "warm", 40, 112),
        row("q", "warm", 60, 112),
        row("q", "after_edit", 55, 96, prefix="p2"),
    ]
    (s,) = summarize(rows)
    assert s.ttft == {"cold": 900, "warm": 50, "after_edit": 55}
    assert s.cached == {"cold": 0, "warm": 112, "after_edit": 96}
    assert s.ratio == 55 / 50 and s.after_edit == "changed, re-warmed"


def test_after_edit_state_tells_unchanged_rewarmed_and_cold_apart():
    warm = row("q", "warm", 40, 112)
    assert after_edit_state([warm, row("q", "after_edit", 40, 112)]) == "unchanged (TTL extended)"
    assert after_edit_state([warm, row("q", "after_edit", 300, 32, prefix="p2")]) == (
        "changed, NOT re-warmed"
    )
    assert after_edit_state([warm]) == "-"
    # The first ask decides: a later one finds the prompt its own answer cached.
    first, later = row("q", "after_edit", 300, 32, prefix="p2"), row("q", "after_edit", 40, 112,
                                                                    prefix="p2")
    assert after_edit_state([warm, first, later]) == "changed, NOT re-warmed"


def test_rewarmed_is_what_the_first_ask_found_cached_not_its_ttft():
    # The demo's run of 2026-12-01: the new prefix is 668 tokens (690 - 22 of question), so
    # 656 cached is all 41 of its full blocks; the 2 more blocks later asks hit (688) hold
    # its last 12 tokens and the question, cached by that first answer. Its TTFT was 2.4x
    # a warm ask's, which had its whole prompt cached (671/672).
    warm = Row("q", "warm", 153, 671, 672, None, 0.0, "p1", 650, "w1")
    first = Row("q", "after_edit", 367, 656, 690, None, 9.0, "p2", 668, "w1")
    later = Row("q", "after_edit", 177, 688, 690, None, 9.5, "p2", 668, "w1")
    other = [row("o", "warm", 40, 112), row("o", "after_edit", 40, 112)]  # TTL extended
    summaries = summarize([warm, first, later, *other])
    assert [s.after_edit for s in summaries] == ["changed, re-warmed", "unchanged (TTL extended)"]
    assert summaries[0].ratio is not None and summaries[0].ratio > 2
    assert rewarm_verdict(summaries) == (
        "edited prefixes warm at their first ask: 1 of 1 (all re-warmed: every full block of "
        "the new prefix cached)")
    cold = Row("q", "after_edit", 900, 80, 690, None, 9.0, "p2", 668, "w1")
    assert "0 of 1 (NOT all re-warmed" in (rewarm_verdict(summarize([warm, cold, later])) or "")
    assert rewarm_verdict(summarize(other)) is None


def test_table_has_a_line_per_question_and_marks_missing_phases():
    rows = [
        row("a question that is much longer than the forty columns of the table", "cold", 900, 0),
        row("short?", "cold", 800, 0),
        row("short?", "warm", 30, 96),
    ]
    lines = table_lines(summarize(rows))
    assert len(lines) == 5 and "…" in lines[2]
    assert lines[3].split()[1:4] == ["800.0", "-", "30.0"]


def test_a_phase_is_what_the_cache_held_not_the_order_of_asking():
    assert held(0, 680) == "cold"
    assert held(32, 680) == "partial"
    assert held(672, 680) == "warm"  # every full block of the prefix
    # The "second cold ask", 640 of 672 prompt tokens cached: its prefix was warm.
    assert held(640, 655) == "warm"


def test_the_first_ask_after_the_edit_stands_beside_plain_prefix_caching():
    after = Row("q", "after_edit", 45, 96, 120, None, 9.0, "p2", 100, "w1", 900.0, 16)
    rows = [row("q", "cold", 900, 0), row("q", "warm", 40, 112), after,
            Row("q", "after_edit", 44, 96, 120, None, 9.5, "p2", 100, "w1", 41.0, 112)]
    (s,) = summarize(rows)
    assert s.first_after == after
    assert s.ratio == 45 / 40 and s.reactive_ratio == 900 / 40
    line = table_lines([s])[2]
    assert "45.0 (96/120)" in line and "900.0 (16/120)" in line


def test_chart_is_written_as_png(tmp_path):
    rows = [row("q", "cold", 900, 0), row("q", "warm", 40, 112), row("q", "after_edit", 45, 96)]
    path = write_chart(rows, 1.5, tmp_path / "out" / "ttft.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rewarm_targets_are_every_changed_prefix_whatever_the_table_shows_yet():
    # Two edits, two documents: when the demo looks, the second invalidation may not be
    # applied, so the old prefix's state still being there must not drop its question
    # (it was then asked before its re-prefill landed: only the system prompt cached).
    before = {"q1": "old1", "q2": "old2", "q3": "same"}
    now = {"q1": "new1", "q2": "new2", "q3": "same", "q4": None}
    assert rewarm_targets(before, now) == {"new1", "new2"}
    assert rewarm_targets(before, {"q1": "old1"}) == set()
