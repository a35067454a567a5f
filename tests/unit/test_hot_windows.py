"""The hot-token windows kept in rows of a mapping (the app's changelog table): what a
restarted or new owner reads back, expiry, ownership, and the hot set stored per tenant."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from schemas import ChunkRef
from streams.decide.hot import (
    HotPayload,
    HotTracker,
    expired_rows,
    row_key,
    slot_of,
    tenant_of,
    window_slots,
)
from streams.decide.records import PrefixOp

REF = ChunkRef(chunk_id="d.md#0", content_hash="1" * 64)


def payload(tenant: str = "t1", question: str = "why?") -> HotPayload:
    return HotPayload(tenant=tenant, question=question, chunk_refs=(REF,), prefix_tokens=32)


def json_rows(rows: dict) -> dict:
    """The rows as a changelog gives them back: through JSON, as new objects."""
    return json.loads(json.dumps(rows))


def test_a_tracker_on_the_same_rows_resumes_the_windows():
    rows: dict = {}
    first = HotTracker(600.0, 60.0, rows=rows)
    for _ in range(3):
        first.observe("p1", payload(), now=100.0)
    first.observe("p2", payload(question="how?"), now=130.0)
    first.flush(130.0)
    resumed = HotTracker(600.0, 60.0, rows=json_rows(rows))
    assert [(h, c) for h, c, _ in resumed.ranked(140.0)] == [("p1", 3.0), ("p2", 1.0)]
    assert resumed.ranked(140.0)[0][2] == payload()
    resumed.observe("p2", payload(question="how?"), now=150.0)
    assert resumed.top_questions(150.0, 5) == [(("t1", "why?"), 3.0), (("t1", "how?"), 2.0)]


def test_observations_are_written_once_per_flush_and_reads_flush_first():
    rows: dict = {}
    tracker = HotTracker(600.0, 60.0, rows=rows)
    tracker.observe("p1", payload(), now=10.0)
    tracker.observe("p1", payload(), now=20.0)
    assert rows == {}
    assert tracker.flush(20.0) == 1 and list(rows) == [row_key("t1", 0)]
    tracker.observe("p1", payload(), now=30.0)
    assert tracker.ranked(30.0)[0][1] == 3.0  # read: the pending step was written first


def test_steps_past_the_window_are_dropped_and_the_hot_row_stays():
    rows: dict = {}
    tracker = HotTracker(600.0, 60.0, rows=rows)
    tracker.observe("old", payload(), now=0.0)
    tracker.hot["old"] = PrefixOp(op="warm", prefix_hash="old", tenant="t1")
    tracker.observe("new", payload(), now=500.0)
    assert {h for h, _, _ in tracker.ranked(500.0)} == {"old", "new"}
    assert [h for h, _, _ in tracker.ranked(700.0)] == ["new"]
    tracker.observe("x", payload(), now=1300.0)
    tracker.flush(1300.0)
    assert sorted(rows) == sorted([row_key("t1", 21), row_key("t1", "hot")])


def test_only_owned_tenants_are_ranked_planned_and_expired():
    rows: dict = {}
    everyone = HotTracker(600.0, 60.0, rows=rows)
    everyone.observe("a", payload("t1"), now=0.0)
    everyone.observe("b", payload("t2"), now=0.0)
    everyone.hot["b"] = PrefixOp(op="warm", prefix_hash="b", tenant="t2")
    everyone.flush(0.0)
    mine = HotTracker(600.0, 60.0, rows=rows, owns=lambda tenant: tenant == "t1")
    assert [h for h, _, _ in mine.ranked(10.0)] == ["a"]
    assert dict(mine.hot) == {}
    mine.flush(5000.0)  # t2's rows belong to another owner: left alone
    assert row_key("t2", 0) in rows and row_key("t1", 0) not in rows


def test_the_hot_set_survives_through_its_rows():
    rows: dict = {}
    tracker = HotTracker(rows=rows)
    op = PrefixOp(op="warm", prefix_hash="p9", tenant="t1", token_ids=[1, 2], pin=True)
    tracker.hot["k1"] = op
    tracker.hot["k2"] = op.model_copy(update={"tenant": "t2"})
    again = HotTracker(rows=json_rows(rows))
    assert again.hot["k1"] == op and set(again.hot) == {"k1", "k2"}
    again.forget("p9")
    assert len(again.hot) == 0 and not any(slot_of(k) is None for k in again.rows)


@given(st.text(min_size=1).filter(lambda t: "\x1f" not in t), st.integers(0, 10**7))
def test_row_keys_round_trip(tenant, slot):
    assert tenant_of(row_key(tenant, slot)) == tenant and slot_of(row_key(tenant, slot)) == slot
    assert slot_of(row_key(tenant, "hot")) is None


@given(st.floats(0, 1e6), st.sampled_from([(600.0, 60.0), (300.0, 60.0), (90.0, 60.0)]))
def test_a_step_is_expired_exactly_when_it_left_the_window(now, sizes):
    window_s, step_s = sizes
    slots = window_slots(now, window_s, step_s)
    keys = [row_key("t", s) for s in range(max(0, slots.start - 3), slots.stop)]
    gone = expired_rows(keys, now, window_s, step_s)
    assert all(slot_of(k) not in slots for k in gone)
    assert all(slot_of(k) in slots for k in keys if k not in gone)


def test_a_row_replaced_under_the_tracker_is_read_again_not_served_from_its_cache():
    rows: dict = {}
    tracker = HotTracker(600.0, 60.0, rows=rows)
    tracker.observe("p1", payload(), now=10.0)
    assert tracker.ranked(10.0)[0][1] == 1.0
    other = HotTracker(600.0, 60.0, rows=json_rows(rows))  # another owner went on counting
    other.observe("p1", payload(), now=20.0)
    other.flush(20.0)
    rows.update(json_rows(other.rows))  # the partition came back, recovered from the changelog
    assert tracker.ranked(30.0)[0][1] == 2.0
    tracker.observe("p1", payload(), now=40.0)
    assert tracker.ranked(40.0)[0][1] == 3.0
