"""The blend's cost gate: a blend runs only where it is estimated to beat the cold prefill,
with coefficients learned from the engine's own timings."""

from __future__ import annotations

import pytest

from workers.kv.blend_cost import BlendCosts, blend_computed


def test_before_any_timing_a_blend_is_tried_only_for_a_large_saving() -> None:
    costs = BlendCosts(explore_ratio=0.5)
    assert costs.worth(cold_tokens=600, computed=200, moved=500)
    assert not costs.worth(cold_tokens=600, computed=400, moved=300)
    assert not costs.worth(cold_tokens=600, computed=600, moved=10)  # saves nothing
    assert not costs.worth(cold_tokens=600, computed=100, moved=0)  # moves nothing


def test_a_blend_whose_overhead_per_moved_token_eats_the_saving_is_refused() -> None:
    costs = BlendCosts()
    for n in (64, 256, 600):
        costs.saw_prefill(n, n * 0.002)  # 2 ms per token
    # Measured blends: 20 ms fixed + 1.5 ms per moved token beyond what they computed.
    for computed, moved in ((100, 200), (150, 400), (120, 300)):
        costs.saw_blend(computed, moved, computed * 0.002 + 0.020 + moved * 0.0015)
    assert costs.learned
    assert costs.blend_s(100, 200) == pytest.approx(0.2 + 0.02 + 0.3)
    # Moving 500 tokens to compute 200 instead of 600: 0.4 + 0.77 s > 1.2 s cold? No: 1.17 s.
    assert costs.worth(cold_tokens=600, computed=200, moved=500)
    # Moving 400 to save 50: the overhead makes it slower than computing them.
    assert not costs.worth(cold_tokens=600, computed=550, moved=400)


def test_cheap_blends_are_learned_as_cheap() -> None:
    costs = BlendCosts()
    costs.saw_prefill(500, 1.0)
    costs.saw_blend(100, 300, 0.2 + 0.01)
    costs.saw_blend(120, 400, 0.24 + 0.012)
    assert costs.worth(cold_tokens=500, computed=300, moved=350)  # past the explore ratio


def test_recomputed_share_is_counted_as_the_selection_does() -> None:
    assert blend_computed(50, 100, 0.3) == 80
    assert blend_computed(50, 7, 0.3) == 53  # ceil(2.1)
    assert blend_computed(50, 0, 0.3) == 50
    with pytest.raises(ValueError):
        BlendCosts(explore_ratio=0)
