"""Unit tests for memory tiers, budgets and the warmup threshold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.kv.memory import (
    BURST_BUFFER_SHARE,
    Budget,
    GiB,
    accepts_warmup,
    memory_tier,
    plan_budget,
    warm_share,
)


@pytest.mark.parametrize(
    ("total", "share", "tier"),
    [
        (0, 0.0, "small"),
        (4 * GiB - 1, 0.0, "small"),
        (4 * GiB, 0.30, "medium"),
        (16 * GiB, 0.30, "medium"),
        (16 * GiB + 1, 0.50, "large"),
        (80 * GiB, 0.50, "large"),
    ],
)
def test_tiers(total: int, share: float, tier: str) -> None:
    assert warm_share(total) == share and memory_tier(total).name == tier


def test_plan_budget_keeps_burst_buffer_and_tier_share() -> None:
    budget = plan_budget(24 * GiB, 100 * GiB, max_entries=7)
    assert budget == Budget(int(24 * GiB * 0.9), 7, 12 * GiB)
    capped = plan_budget(24 * GiB, 2 * GiB)
    assert capped.max_bytes == 2 * GiB and capped.warm_bytes == 2 * GiB
    assert plan_budget(2 * GiB, GiB).warm_bytes == 0
    with pytest.raises(ValueError):
        plan_budget(-1, 1)


@given(total=st.integers(0, 2**44), cap=st.integers(0, 2**44))
def test_plan_budget_bounds(total: int, cap: int) -> None:
    budget = plan_budget(total, cap)
    assert budget.max_bytes <= min(cap, total * (1 - BURST_BUFFER_SHARE))
    assert budget.warm_bytes <= budget.max_bytes
    assert budget.warm_bytes <= total * warm_share(total)


def test_budget_rejects_negative() -> None:
    with pytest.raises(ValueError, match="warm_bytes"):
        Budget(1, 1, -1)


def test_accepts_warmup_threshold() -> None:
    assert accepts_warmup(70, 100) and not accepts_warmup(71, 100)
    assert accepts_warmup(50, 100, threshold=0.5) and not accepts_warmup(1, 0)
