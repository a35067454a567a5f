"""`ragwarm deadletter`: which letters match, and what a redrive sends (no Kafka)."""

from __future__ import annotations

from types import SimpleNamespace

from ragwarm.kafka.deadletter import (
    REDRIVE_TOPICS,
    Letter,
    mark_key,
    mark_value,
    plan_redrive,
    select,
    summary,
    with_marks,
)
from schemas import encode
from schemas.deadletter import Origin, dead_letter

ALLOWED = {"t.kb.changes"}

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
    plan = plan_redrive(_letter(b"payload", "x"), lambda *a: None, ALLOWED)
    assert (plan.topic, plan.key, plan.value, plan.skipped) == (
        "t.kb.changes", b"doc.md", b"payload", None
    )


def test_a_truncated_letter_is_read_back_and_checked():
    letter = _letter(BIG, "x", limit=100)
    asked = []

    def fetch(topic, partition, offset):
        asked.append((topic, partition, offset))
        return BIG

    plan = plan_redrive(letter, fetch, ALLOWED)
    assert plan.value == BIG and asked == [("t.kb.changes", 1, 9)]
    differs = plan_redrive(letter, lambda *a: b"other", ALLOWED).skipped
    assert differs == "original at that offset differs"
    gone = plan_redrive(letter, lambda *a: None, ALLOWED).skipped
    assert gone == "original no longer in its topic"
    assert summary(letter)["bytes"] == 5000 and summary(letter)["truncated"]


def _crafted(topic: str) -> Letter:
    origin = Origin(topic, 0, 1, b"k", b"anything")
    return Letter(0, 3, dead_letter(origin, "crafted", None, 1024))


def test_a_letter_naming_a_topic_outside_the_allow_list_is_refused():
    """The defect: redrive sent a letter to whatever topic it named, with the operator's
    credentials (any process that can write the dead-letter topic could craft one)."""
    plan = plan_redrive(_crafted("payments.ledger"), lambda *a: None, ALLOWED)
    assert plan.value is None and plan.skipped is not None
    assert plan.skipped.startswith("refused: topic 'payments.ledger' is not one ragwarm")
    assert "--allow-topic" in plan.skipped
    assert plan_redrive(_crafted("payments.ledger"), lambda *a: None,
                        {"payments.ledger"}).skipped is None


def test_the_default_allow_list_is_the_topics_ragwarm_dead_letters_from():
    from streams.shell.topics import DOC_LINKS, PREFIX_OPS, WORKER_READY

    assert {PREFIX_OPS, DOC_LINKS, WORKER_READY} <= set(REDRIVE_TOPICS)
    assert {"kb.changes", "rag.queries", "warmup.commands", "worker.events",
            "rag.chunks"} <= set(REDRIVE_TOPICS)
    assert "ragwarm.deadletter" not in REDRIVE_TOPICS


def _record(partition: int, offset: int, value: bytes):
    return SimpleNamespace(partition=partition, offset=offset, value=value)


def test_a_redriven_letter_is_marked_and_a_second_redrive_skips_it():
    """The defect: nothing recorded that a letter was sent, so every redrive sent every
    letter again."""
    first = _letter(b"one", "x", offset=0)
    second = _letter(b"two", "x", offset=1)
    log = [_record(0, 0, encode(first.letter)), _record(0, 1, encode(second.letter)),
           _record(0, 2, mark_value(first, "t.kb.changes"))]
    letters = with_marks(log)
    assert [x.redriven is not None for x in letters] == [True, False]
    plans = [plan_redrive(x, lambda *a: None, ALLOWED) for x in letters]
    assert plans[0].skipped is not None and plans[0].skipped.startswith("already redriven")
    assert plans[1].skipped is None and plans[1].value == b"two"
    assert plan_redrive(letters[0], lambda *a: None, ALLOWED, again=True).skipped is None
    assert mark_key(first) != mark_key(second)
    assert summary(letters[0])["redriven"] == letters[0].redriven
