"""`bench kv-precision`'s pure parts: where a prompt is cut, what a 16-bit store gives back."""

from __future__ import annotations

import torch

from ragwarm.bench.blend import Case
from ragwarm.bench.kv_precision import Agreement, cut_at, rounded, summary


def _case() -> Case:
    return Case("q", list(range(20)), opening=4, chunks=[("a@1", [0] * 5), ("b@2", [0] * 6)])


def test_prefix_cut_holds_the_opening_and_chunks_and_whole_leaves_one_token():
    assert cut_at(_case(), "prefix") == 15
    assert cut_at(_case(), "whole") == 19


def test_rounded_kv_keeps_its_dtype_and_loses_what_float16_cannot_hold():
    k = torch.tensor([[1.0 + 2**-12, 3.0]])
    v = torch.tensor([[70000.0, -2.5]])
    ((rk, rv),) = rounded(((k, v),), torch.float16)
    assert rk.dtype == torch.float32 and rv.dtype == torch.float32
    assert rk.tolist() == [[1.0, 3.0]]  # below float16's precision at 1.0
    assert rv[0, 0].isinf()  # beyond float16's range: the study would show it
    ((bk, _),) = rounded(((k, v),), torch.bfloat16)
    assert bk.tolist() == [[1.0, 3.0]]


def test_summary_rates_and_kl():
    rows = [Agreement(True, True, 0.0), Agreement(True, False, 0.002),
            Agreement(False, False, 0.004)]
    s = summary(rows)
    assert s["first_token_agreement"] == round(2 / 3, 4)
    assert s["greedy16_exact"] == round(1 / 3, 4)
    assert s["mean_kl_first_token"] == 0.002
    assert s["max_kl_first_token"] == 0.004
