"""The hot set's rent rule: pin only what request caching alone would lose between asks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.decide.rent import RentLedger, ReuseStack, paying
from streams.settings import StreamsSettings


def test_reuse_distance_is_the_size_of_the_other_prefixes_asked_since() -> None:
    stack = ReuseStack()
    assert stack.ask("a", 10) is None  # a first ask
    assert stack.ask("b", 20) is None
    assert stack.ask("c", 30) is None
    assert stack.ask("a", 10) == 50  # b and c since
    assert stack.ask("a", 10) == 0  # asked again at once
    assert stack.ask("b", 20) == 40  # c and a (counted once)


def test_a_prefix_asked_twice_is_pushed_out_only_by_others_asked_again() -> None:
    stack = ReuseStack()
    for key in "ab":
        stack.ask(key, 10)
        stack.ask(key, 10)  # both in SLRU's second segment
    for key in "xyz":
        stack.ask(key, 100)  # asked once: SLRU evicts these first
    assert stack.ask("a", 10) == 10  # only b counts


def test_the_walk_stops_past_the_cap_and_the_stack_is_bounded() -> None:
    stack = ReuseStack(max_tracked=3)
    for key in "abc":
        stack.ask(key, 100)
    assert stack.ask("a", 100, cap=50) == 100  # just past the cap: beyond, whatever the rest
    stack.ask("d", 1)  # "b" falls off the bottom
    assert stack.ask("b", 1) is None


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 50)), max_size=60))
def test_distance_matches_a_replay_of_the_stream(asks: list[tuple[str, int]]) -> None:
    stack = ReuseStack()
    for i, (key, size) in enumerate(asks):
        before = [k for k, _ in asks[:i]]
        expected = None
        if key in before:
            last = max(j for j, k in enumerate(before) if k == key)
            since = {k for k, _ in asks[last + 1:i] if k != key}
            if before.count(key) >= 2:  # in SLRU's second segment: others asked again only
                since = {k for k in since if before.count(k) >= 2}
            # each distinct prefix counted once, at its latest size
            expected = sum(dict((k, s) for k, s in asks[:i] if k in since).values())
        assert stack.ask(key, size) == expected


def test_a_prefix_pays_only_when_a_re_ask_came_from_beyond_request_caching() -> None:
    ledger = RentLedger()
    ledger.plan(capacity_tokens=100, forget_before=0)
    ledger.ask("hot", 40, now=1)
    ledger.ask("hot", 40, now=2)  # asked again at once: request caching holds it
    assert not ledger.pays("hot", now=3, window_s=600)
    for n, other in enumerate("abc"):
        ledger.ask(other, 50, now=4 + n)  # asked once: SLRU pushes these out first
    ledger.ask("hot", 40, now=7)
    assert not ledger.pays("hot", now=8, window_s=600)
    for n, other in enumerate("abcabc"):
        ledger.ask(other, 50, now=8 + n)  # 150 tokens asked again: beyond the 100 it holds
    ledger.ask("hot", 40, now=20)
    assert ledger.pays("hot", now=21, window_s=600)
    assert not ledger.pays("hot", now=700, window_s=600)  # that miss left the window
    ledger.plan(100, forget_before=650)
    assert not ledger.pays("hot", now=21, window_s=600)  # forgotten


def test_an_unknown_reach_counts_every_re_ask() -> None:
    ledger = RentLedger()  # no plan yet: no worker memory known
    ledger.ask("q", 10, now=1)
    assert not ledger.pays("q", now=2, window_s=60)  # a first ask saves nothing
    ledger.ask("q", 10, now=2)
    assert ledger.pays("q", now=3, window_s=60)


class Payload:
    def __init__(self, tokens: int) -> None:
        self.prefix_tokens = tokens


def test_paying_filters_the_ranked_candidates_unless_the_rule_is_off() -> None:
    ledger = RentLedger()
    ledger.plan(25, forget_before=0)  # request caching holds 25 tokens
    for key in ("far", "near", "near", "x", "y", "far"):
        ledger.ask(key, 10, now=1)
    ranked = [("near", 5.0, Payload(10)), ("far", 2.0, Payload(10))]
    on = StreamsSettings(hot_window_s=600)
    # Reach 25 tokens: "near" came back at distance 0, "far" at 40 (near, x, y).
    assert [c.prefix_hash for c in paying(ledger, ranked, 25, 2, on)] == ["far"]
    off = on.model_copy(update={"hot_pin_rent": False})
    assert [c.prefix_hash for c in paying(ledger, ranked, 25, 2, off)] == ["near", "far"]
