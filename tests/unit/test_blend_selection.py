"""Choosing which moved chunk tokens to recompute: budgets, sinks and the top-scored rows."""

from __future__ import annotations

import typing

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.engines.blend import (
    SELECTORS,
    Piece,
    Selection,
    _causal_mask,
    _moved_positions,
    _plan,
    _top_rows,
)
from workers.settings import ChunkSelection


def _piece(start: int, length: int, computed_at: int = 10) -> Piece:
    kv = ((torch.zeros(1, 1, length, 2), torch.zeros(1, 1, length, 2)),)
    return Piece(start=start, kv=kv, computed_at=computed_at)


def test_settings_name_the_same_selections() -> None:
    assert set(typing.get_args(ChunkSelection)) == set(SELECTORS)


def test_unknown_method_and_bad_share_are_refused_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match="hkvd, attn"):
        Selection(method="random")
    with pytest.raises(ValueError, match="share"):
        Selection(share=1.5)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 80), min_size=1, max_size=4),
    share=st.floats(0, 1),
    method=st.sampled_from(SELECTORS),
    sinks=st.integers(0, 16),
)
def test_plan_never_exceeds_the_share_and_picks_only_moved_tokens(
    lengths: list[int], share: float, method: str, sinks: int
) -> None:
    pieces, start = [], 10
    for n in lengths:
        pieces.append(_piece(start, n))
        start += n
    moved = list(range(10, start))
    chosen, by_score = _plan(Selection(method, share, sinks), moved, pieces, 10)
    budget = min(len(moved), -(-share * len(moved) // 1))
    exact_budget = method not in ("sink", "tail")  # fixed picks may fall short of it
    assert len(chosen) + by_score == budget if exact_budget else len(chosen) <= budget
    assert set(chosen) <= set(moved)
    assert len(set(chosen)) == len(chosen)


def test_sink_takes_each_moved_piece_first_tokens() -> None:
    pieces = [_piece(10, 20), _piece(30, 20)]
    chosen, by_score = _plan(Selection("sink", 0.2), list(range(10, 50)), pieces, 10)
    assert (chosen, by_score) == ([10, 11, 12, 13, 30, 31, 32, 33], 0)


def test_tail_takes_the_last_piece_whole_then_the_others_first_tokens() -> None:
    pieces = [_piece(10, 20), _piece(30, 20), _piece(50, 10)]
    moved = list(range(10, 60))
    # 50 moved tokens, share 0.4: budget 20 = the last piece (10) + 5 first of each other.
    chosen, by_score = _plan(Selection("tail", 0.4), moved, pieces, 10)
    assert by_score == 0
    assert chosen == [*range(10, 15), *range(30, 35), *range(50, 60)]
    # A budget smaller than the last piece takes its first tokens only.
    chosen, _ = _plan(Selection("tail", 0.1), moved, pieces, 10)
    assert chosen == list(range(50, 55))


def test_sink_plus_score_leaves_the_rest_of_the_budget_to_the_score() -> None:
    pieces = [_piece(10, 20), _piece(30, 20)]
    chosen, by_score = _plan(Selection("sink+hkvd", 0.25, sink_tokens=2), list(range(10, 50)),
                             pieces, 10)
    assert chosen == [10, 11, 30, 31]
    assert by_score == 6


def test_top_rows_keeps_the_forced_rows_and_the_best_others_in_order() -> None:
    score = torch.tensor([5.0, 0.1, 3.0, 9.0, 0.2])
    forced = torch.tensor([False, True, False, False, True])
    assert _top_rows(score, forced, 2).tolist() == [0, 1, 3, 4]
    assert _top_rows(score, forced, 0).tolist() == [1, 4]


def test_gradual_filtering_narrows_from_widened_share_to_the_share() -> None:
    kept = Selection("hkvd", 0.25, checks=(1, 4, 10), widen=2.0).kept(100)
    assert kept == {1: 50, 4: 36, 10: 25}
    assert Selection("hkvd", 0.9, checks=(1, 4), widen=2.0).kept(10) == {1: 10, 4: 9}


def test_checks_must_increase() -> None:
    with pytest.raises(ValueError, match="checks"):
        Selection(checks=(4, 1))


def test_causal_mask_lets_each_chosen_row_see_the_prompt_up_to_its_own_position() -> None:
    mask = _causal_mask(torch.tensor([1, 4, 5]), torch.float32)
    assert mask.shape == (3, 6)  # up to the last row, inclusive
    visible = mask == 0
    assert visible.tolist() == [
        [True, True, False, False, False, False],
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]
    assert bool(torch.isneginf(mask[~visible]).all())


def test_a_piece_computed_after_exactly_what_precedes_it_is_not_moved() -> None:
    # Computed after the opening alone and standing right after it: settled by position.
    first = _piece(10, 5, computed_at=10)
    # Bridged: computed after the chunk before it (so at its own position), told by the caller.
    bridged = Piece(start=15, kv=_piece(0, 5).kv, computed_at=15, in_context=True)
    # Same positions by coincidence, after other text: moved, though no rotation is needed.
    elsewhere = Piece(start=20, kv=_piece(0, 5).kv, computed_at=20, in_context=False)
    moved = _piece(25, 5, computed_at=10)
    assert first.settled and bridged.settled
    assert not elsewhere.settled and not moved.settled
    assert _moved_positions([first, bridged, elsewhere, moved], 10) == [*range(20, 30)]
    # Tokens the exact prefix covers are never moved.
    assert _moved_positions([moved], 27) == [27, 28, 29]
