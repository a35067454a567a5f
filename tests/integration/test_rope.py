"""Key re-rotation on the real SmolLM2: a chunk moved from 0 to p equals it computed at p."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from ragwarm.models import fetch_llm
from workers.engines.rope import inv_freq, shift_keys

pytestmark = pytest.mark.integration

TEXT = (
    "Argo CD is a declarative, GitOps continuous delivery tool for Kubernetes. "
    "Applications are defined as Kubernetes manifests kept in a Git repository."
)


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    path = fetch_llm()
    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True
    ).eval()


def _kv_at(model: Any, ids: list[int], start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's (keys, values) of `ids` placed at positions start, start + 1, … alone."""
    past = DynamicCache(config=model.config)
    positions = torch.arange(start, start + len(ids)).unsqueeze(0)
    with torch.inference_mode():
        model(
            input_ids=torch.tensor([ids]), position_ids=positions, past_key_values=past,
            use_cache=True, logits_to_keep=1,
        )
    return [(k, v) for k, v, *_ in past]


@pytest.mark.parametrize("position", [1, 37, 900, 4000])
def test_moved_keys_equal_keys_computed_there(model: Any, position: int) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(fetch_llm()), local_files_only=True)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    at_zero, at_p = _kv_at(model, ids, 0), _kv_at(model, ids, position)
    freqs = inv_freq(model)
    for layer, ((k0, v0), (kp, vp)) in enumerate(zip(at_zero, at_p, strict=True)):
        moved = shift_keys(k0, position, freqs)
        scale = kp.abs().max()
        assert torch.allclose(moved, kp, atol=2e-4 * scale, rtol=0), f"layer {layer} keys"
        # Values carry no position: attention depends on relative positions only.
        assert torch.allclose(v0, vp, atol=2e-4 * vp.abs().max(), rtol=0), f"layer {layer}"


def test_per_token_deltas_match_scalar_delta(model: Any) -> None:
    keys = torch.randn(1, 3, 5, 64)
    freqs = inv_freq(model)
    one = shift_keys(keys, 11, freqs)
    many = shift_keys(keys, torch.full((5,), 11), freqs)
    assert torch.allclose(one, many)
