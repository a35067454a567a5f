"""The app's process-local log of recent asks, and which prefixes an edit re-checks."""

from __future__ import annotations

from schemas import ChunkRef
from streams.decide.asks import AskLog, entered, often_asked, recheck_order

REFS = [ChunkRef(chunk_id="a.md#0", content_hash="1" * 64)]


def test_asks_leave_the_log_with_the_window_and_the_least_recent_go_past_capacity():
    log = AskLog(window_s=100.0, capacity=2)
    log.observe("p1", "t", "one?", REFS, 32, 0.0)
    log.observe("p1", "t", "one again?", REFS, 32, 50.0)
    log.observe("p2", "t", "two?", REFS, 16, 60.0)
    recent = log.recent(120.0)  # the ask at 0 s is out of the window
    assert list(recent["p1"].times) == [50.0] and recent["p1"].question == "one again?"
    log.observe("p1", "t", "one?", REFS, 32, 130.0)  # p1 asked last: p2 is the oldest
    log.observe("p3", "t", "three?", REFS, 8, 140.0)
    assert set(log.recent(140.0)) == {"p1", "p3"}
    assert log.recent(500.0) == {}


def test_recheck_goes_most_asked_then_latest_first_skipping_the_dependents():
    log = AskLog(window_s=1000.0)
    for h, at in (("a", 1.0), ("a", 2.0), ("b", 3.0), ("c", 4.0), ("d", 5.0)):
        log.observe(h, "t", f"{h}?", REFS, 32, at)
    order = recheck_order(log.recent(10.0), skip={"d"}, limit=2)
    assert [h for h, _ in order] == ["a", "c"]


def test_an_edit_entered_a_top3_only_through_its_own_chunks():
    new = [ChunkRef(chunk_id="b.md#1", content_hash="2" * 64), *REFS]
    assert entered(new, {"b.md#0": "x", "b.md#1": "y"})
    assert not entered(REFS, {"b.md#0": "x"})


def test_the_seen_counts_outlive_the_window_and_the_capacity_drops_the_least_recent():
    log = AskLog(window_s=100.0, capacity=2)
    log.observe("p1", "t", "one?", REFS, 32, 0.0)
    log.observe("p1", "t", "one?", REFS, 40, 50.0)
    log.observe("p2", "t", "two?", REFS, 16, 60.0)
    assert log.recent(1000.0) == {}  # out of the window, still counted
    assert (log.seen["p1"].count, log.seen["p1"].last, log.seen["p1"].tokens) == (2, 50.0, 40)
    log.observe("p3", "t", "three?", REFS, 8, 70.0)
    assert set(log.seen) == {"p2", "p3"}


def test_often_asked_keeps_dependents_asked_more_than_once_most_asked_then_latest_first():
    log = AskLog(window_s=10.0)
    for h, at in (("a", 1.0), ("a", 2.0), ("b", 3.0), ("b", 4.0), ("c", 5.0),
                  ("d", 6.0), ("d", 7.0), ("d", 8.0), ("e", 9.0), ("e", 10.0)):
        log.observe(h, "t", f"{h}?", REFS, 32, at)
    found = often_asked(log.seen, dependents={"a", "b", "c", "d", "x"}, skip={"e", "d"})
    assert [h for h, _ in found] == ["b", "a"]  # c asked once, d skipped, e no dependent


def test_the_ask_log_keeps_a_bounded_number_of_ask_times():
    """The defect: every ask time stayed until the next edit (1M asks of one prefix: a
    million floats, 32 MB); now at most `MAX_TIMES`, and none older than the window."""
    from streams.decide.asks import MAX_TIMES, AskLog

    log = AskLog(window_s=100.0)
    for i in range(20_000):
        log.observe("p1", "default", "q?", [], 10, float(i) / 10)
    assert len(log.entries["p1"].times) <= MAX_TIMES
    log.observe("p2", "default", "q?", [], 10, 0.0)
    log.observe("p2", "default", "q?", [], 10, 500.0)  # the first ask left the window
    assert list(log.entries["p2"].times) == [500.0]
