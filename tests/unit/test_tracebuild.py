"""The trace builder's pure part: question headings and a history turned into trace records."""

from __future__ import annotations

from ragwarm.tracebuild.headings import clean_heading, question_headings
from ragwarm.tracebuild.history import Change, Commit, build

DOC = """# Title

## How do I install it?
Run `make`.

### Details
More.

## Why is it `slow`?
Because.

```
# Is this code?
```

## Notes
"""


def test_headings_phrased_as_questions_with_their_sections() -> None:
    found = question_headings(DOC)
    assert [h.question for h in found] == ["How do I install it?", "Why is it slow?"]
    assert found[0].answer == "Run `make`.\n\n### Details\nMore."
    assert found[1].answer.startswith("Because.")


def test_heading_text_loses_links_marks_and_anchors() -> None:
    assert clean_heading("What is [Argo](http://x)? {#what}") == "What is Argo?"
    assert clean_heading("Can I use **`kubectl`**?  ") == "Can I use kubectl?"


def _commit(n: int, *changes: Change, initial: bool = False) -> Commit:
    return Commit(f"c{n}", f"2024-01-0{n}T00:00:00+00:00", f"edit {n}", changes, initial)


def test_history_events_in_commit_order_with_versions_and_flags() -> None:
    history = build([
        _commit(1, Change("a.md", "A1"), Change("b.md", "B1"), initial=True),
        _commit(2, Change("a.md", "A2")),
        _commit(3, Change("a.md", "A2"), Change("b.md", None), Change("z.md", None)),
    ], max_chars=10)
    ops = [(e["seq"], e["op"], e["doc_id"], e["initial"]) for e in history.events]
    assert ops == [(0, "upsert", "a.md", True), (1, "upsert", "b.md", True),
                   (2, "upsert", "a.md", False), (3, "upsert", "a.md", False),
                   (4, "delete", "b.md", False)]  # z.md was never seen: no delete
    assert [e.get("text_changed") for e in history.events[2:4]] == [True, False]
    stats = history.stats()
    assert (stats["initial_upserts"], stats["upserts"], stats["deletes"]) == (2, 2, 1)
    assert stats["unchanged_upserts"] == 1


def test_long_texts_are_trimmed_and_say_so() -> None:
    event = build([_commit(1, Change("a.md", "x" * 25))], max_chars=10).events[0]
    assert (len(event["text"]), event["truncated"], event["full_chars"]) == (10, True, 25)


def test_questions_live_from_their_first_version_until_removed() -> None:
    history = build([
        _commit(1, Change("faq.md", "## How do I A?\nyes\n## Why not B?\nno")),
        _commit(2, Change("faq.md", "## How do I A?\nyes, now\n")),
        _commit(3, Change("faq.md", None)),
    ])
    a, b = history.questions
    assert (a["qid"], a["question"], a["first_seq"], a["removed_seq"]) == (
        "q0000", "How do I A?", 0, 2)
    assert a["answer_section"] == "yes, now"  # the last text it had
    assert (b["question"], b["first_seq"], b["removed_seq"], b["live_at_end"]) == (
        "Why not B?", 0, 1, False)


def test_a_question_added_again_is_a_new_question() -> None:
    history = build([
        _commit(1, Change("faq.md", "## Can I C?\n")),
        _commit(2, Change("faq.md", "nothing\n")),
        _commit(3, Change("faq.md", "## Can I C?\n")),
    ])
    assert [(q["qid"], q["first_seq"], q["removed_seq"]) for q in history.questions] == [
        ("q0000", 0, 1), ("q0001", 2, None)]
