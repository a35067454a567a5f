"""`ragwarm deadletter`: which letters match, and what a redrive sends (no Kafka)."""

from __future__ import annotations

from ragwarm.kafka.deadletter import Letter, plan_redrive, select, summary
from schemas.deadletter import Origin, dead_letter

BIG = b"y" * 5000


def _letter(value: bytes, reason: str, limit: int = 1 << 20, offset: int = 9) -> Letter:
    origin = Origin("t.kb.changes", 1, offset, b"doc.md", value)
    return Letter(0, offset, dead_letter(origin, reason, None, limit))


def test_select_by_reason_substring_any_case():
    letters = [_letter(b"a", "transient failure, retries exhausted: OSError"),
               _letter(b"b", "op: Input should be 'upsert'")]
    assert [x.letter.reason for x in select(letters, "TRANSIENT")] == [letters[0].letter.reason]
    assert select(letters, None) == letters


def test_redrive_sends_the_original_key_and_value():
    plan = plan_redrive(_letter(b"payload", "x"), lambda *a: None)
    assert (plan.topic, plan.key, plan.value, plan.skipped) == (
        "t.kb.changes", b"doc.md", b"payload", None
    )


def test_a_truncated_letter_is_read_back_and_checked():
    letter = _letter(BIG, "x", limit=100)
    asked = []

    def fetch(topic, partition, offset):
        asked.append((topic, partition, offset))
        return BIG

    plan = plan_redrive(letter, fetch)
    assert plan.value == BIG and asked == [("t.kb.changes", 1, 9)]
    assert plan_redrive(letter, lambda *a: b"other").skipped == "original at that offset differs"
    assert plan_redrive(letter, lambda *a: None).skipped == "original no longer in its topic"
    assert summary(letter)["bytes"] == 5000 and summary(letter)["truncated"]
