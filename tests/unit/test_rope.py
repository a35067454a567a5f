"""Key re-rotation is a rotation: it composes, undoes itself and keeps norms."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.engines.rope import rotate_half, shift_keys

FREQS = 1.0 / (100000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))


def _keys(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, 4, 64, generator=gen, dtype=torch.float64)


@settings(max_examples=40, deadline=None)
@given(a=st.integers(-5000, 5000), b=st.integers(-5000, 5000), seed=st.integers(0, 1000))
def test_shifts_compose(a: int, b: int, seed: int) -> None:
    keys = _keys(seed)
    twice = shift_keys(shift_keys(keys, a, FREQS), b, FREQS)
    assert torch.allclose(twice, shift_keys(keys, a + b, FREQS), atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(delta=st.integers(-8000, 8000), seed=st.integers(0, 1000))
def test_shift_back_restores_and_keeps_norms(delta: int, seed: int) -> None:
    keys = _keys(seed)
    moved = shift_keys(keys, delta, FREQS)
    assert torch.allclose(moved.norm(dim=-1), keys.norm(dim=-1), atol=1e-9)
    assert torch.allclose(shift_keys(moved, -delta, FREQS), keys, atol=1e-9)


def test_zero_shift_is_identity_and_rotate_half_is_a_quarter_turn() -> None:
    keys = _keys(0)
    assert torch.equal(shift_keys(keys, 0, FREQS), keys)
    assert torch.equal(rotate_half(rotate_half(keys)), -keys)
