"""Chunk-KV blending on the real SmolLM2: exact where nothing moved or everything is recomputed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragwarm.models import fetch_llm
from workers.engines.blend import Piece, Selection, blend, prefill

pytestmark = pytest.mark.integration

OPENING = "<|im_start|>system\nAnswer from the context.\n\nContext:\n"
CHUNKS = (
    "\n[a#0]\nArgo CD is a declarative, GitOps continuous delivery tool for Kubernetes.\n",
    "\n[b#0]\nApplications are defined as Kubernetes manifests kept in a Git repository.\n",
    "\n[c#0]\nA sync operation applies the desired state from Git to the live cluster.\n",
)
QUESTION = "<|im_end|>\n<|im_start|>user\nWhat does a sync do?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model_and_ids() -> tuple[Any, list[list[int]]]:
    torch.set_num_threads(1)
    path = fetch_llm()
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    parts = [OPENING, *CHUNKS, QUESTION]
    return model, [tokenizer.encode(p, add_special_tokens=False) for p in parts]


def _pieces(model: Any, parts: list[list[int]], opening_kv: Any) -> list[Piece]:
    """Each chunk's KV computed on its own after the opening, placed at its prompt position."""
    pieces, start = [], len(parts[0])
    for ids in parts[1:-1]:
        kv, _ = prefill(model, ids, opening_kv)
        pieces.append(Piece(start=start, kv=kv, computed_at=len(parts[0])))
        start += len(ids)
    return pieces


def test_recomputing_every_moved_token_equals_the_full_prefill(model_and_ids: Any) -> None:
    model, parts = model_and_ids
    ids = [t for p in parts for t in p]
    full_kv, full_logits = prefill(model, ids)
    opening_kv, _ = prefill(model, parts[0])
    pieces = _pieces(model, parts, opening_kv)
    for method in ("hkvd", "attn", "sink", "sink+hkvd"):
        result = blend(model, ids, opening_kv, pieces, Selection(method=method, share=1.0))
        assert result.moved == len(parts[2]) + len(parts[3])  # the first chunk is exact
        assert result.recomputed == result.moved
        assert torch.allclose(result.logits, full_logits, atol=2e-3), method
        for (k, v), (fk, fv) in zip(result.kv, full_kv, strict=True):
            assert torch.allclose(k, fk, atol=2e-3) and torch.allclose(v, fv, atol=2e-3)


def test_a_share_recomputes_that_many_moved_tokens_and_stays_close(model_and_ids: Any) -> None:
    model, parts = model_and_ids
    ids = [t for p in parts for t in p]
    _, full_logits = prefill(model, ids)
    opening_kv, _ = prefill(model, parts[0])
    pieces = _pieces(model, parts, opening_kv)
    result = blend(model, ids, opening_kv, pieces, Selection(share=0.25))
    assert result.recomputed == -(-result.moved // 4)
    none = blend(model, ids, opening_kv, pieces, Selection(share=0.0))
    assert none.recomputed == 0
    p = full_logits.log_softmax(-1)

    def kl(logits: torch.Tensor) -> float:
        q = logits.log_softmax(-1)
        return float((p.exp() * (p - q)).sum())

    # Tiny chunks here (≈ 20 tokens): a loose bound only (a partial recompute is not always
    # closer than none on such prompts); bench blend measures the real quality.
    assert kl(result.logits) < 0.1
    assert kl(none.logits) < 0.1


def test_a_prompt_whose_last_token_is_reused_is_refused(model_and_ids: Any) -> None:
    model, parts = model_and_ids
    ids = [t for p in parts[:-1] for t in p]
    opening_kv, _ = prefill(model, parts[0])
    with pytest.raises(ValueError, match="last prompt token"):
        blend(model, ids, opening_kv, _pieces(model, parts, opening_kv), Selection())
