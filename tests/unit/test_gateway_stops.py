"""Stop sequences cut the text before the first one, however the stream splits it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragwarm.gateway.stops import StopCut


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """The whole text cut at the earliest stop sequence (what OpenAI returns)."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[:min(found)], True) if found else (text, False)


def test_the_text_ends_before_the_first_stop_and_the_reason_is_stop() -> None:
    cut = StopCut(["\n", "Q:"])
    assert cut.cut("Reset it in Settings.\nQ: next") == "Reset it in Settings."
    assert cut.finish_reason("length") == "stop"
    assert StopCut(["\n"]).finish_reason("length") == "length"


def test_a_stop_split_across_pieces_is_never_handed_out() -> None:
    cut = StopCut(["END"])
    assert cut.feed("one E") == "one "
    assert cut.feed("N") == ""
    assert cut.feed("D two") == ""
    assert cut.flush() == "" and cut.hit


def test_a_held_tail_that_was_no_stop_comes_out_at_the_end() -> None:
    cut = StopCut(["END"])
    assert cut.feed("the EN") == "the "
    assert cut.flush() == "EN" and not cut.hit


def test_a_longer_stop_begun_first_wins_over_a_shorter_one_completed_inside_it() -> None:
    """Found by the property below: OpenAI cuts at the earliest stop's start."""
    cut = StopCut(["E", "DEE"])
    assert cut.feed("DE") == "" and not cut.hit
    assert cut.feed("E") == "" and cut.hit
    held = StopCut(["E", "DEE"])
    assert held.feed("xDE") == "x" and held.flush() == "D" and held.hit


pieces = st.lists(st.text(alphabet="abE\nND", max_size=6), max_size=12)
stops = st.lists(st.text(alphabet="abE\nND", min_size=1, max_size=3), min_size=1, max_size=4)


@given(pieces, stops)
def test_streamed_pieces_give_what_cutting_the_whole_text_gives(parts, seqs) -> None:
    cut = StopCut(seqs)
    streamed = "".join(cut.feed(p) for p in parts) + cut.flush()
    assert (streamed, cut.hit) == reference("".join(parts), seqs)
