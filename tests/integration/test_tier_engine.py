"""The torch engine on the real SmolLM2 copy: chunked prefill, and the disk tier's spill and
restore giving back exactly the KV that left."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragwarm.models import fetch_llm
from workers.cache import PrefixCache
from workers.engines.torch_engine import TorchEngine, load_torch_engine
from workers.memory import Budget
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

TEXT = "Argo CD syncs the live state of an application with the state kept in Git. " * 12


@pytest.fixture(scope="module")
def model_path() -> Path:
    return fetch_llm()


def _answer(engine: TorchEngine, prompt: list[int], tenant: str) -> tuple[tuple[int, ...], int]:
    steps = list(engine.generate(prompt, max_tokens=4, tenant=tenant))
    result = steps[-1].result
    assert result is not None
    return result.token_ids, result.cached_tokens


def test_chunked_prefill_stores_the_same_kv_as_one_pass(model_path: Path) -> None:
    engine = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1))
    assert engine.prefill_chunk == 512  # the seed's CPU default
    ids = engine.tokenize(TEXT)[:160]
    engine.prefill_chunk = 10_000
    whole = engine.prefill(ids, tenant="whole")
    engine.prefill_chunk = 48  # not a multiple of the block size
    chunked = engine.prefill(ids, tenant="chunked")
    a, b = engine.stored_kv(whole.prefix_hash), engine.stored_kv(chunked.prefix_hash)
    assert a is not None and b is not None
    for (ka, va), (kb, vb) in zip(a, b, strict=True):
        torch.testing.assert_close(ka, kb, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(va, vb, rtol=1e-4, atol=1e-4)
    question = engine.tokenize(" What does it sync?")
    assert _answer(engine, ids + question, "whole")[0] == _answer(engine, ids + question, "x")[0]


def test_an_evicted_prefix_spills_to_disk_and_comes_back_bit_for_bit(
    model_path: Path, tmp_path: Path
) -> None:
    settings = WorkerSettings(
        device="cpu", threads=1, disk_tier=True, disk_tier_path=tmp_path / "tier"
    )
    probe = load_torch_engine(model_path, settings)
    ids = probe.tokenize(TEXT)[:96]  # 6 blocks
    room = 8 * probe.block_bytes  # one prefix fits, two do not
    engine = load_torch_engine(
        model_path, settings, cache=PrefixCache(Budget(room, 10, room), block_size=16)
    )
    first = engine.prefill(ids, tenant="a", kind="request")
    kept = [b.data.clone() for b in engine.stored_blocks(first.prefix_hash) or []]
    assert not any((tmp_path / "tier").rglob("*.safetensors"))  # request blocks: not yet
    engine.prefill(ids, tenant="b", kind="request")  # evicts tenant a's prefix for room
    assert first.prefix_hash not in engine.cache
    assert len(list((tmp_path / "tier").rglob("*.safetensors"))) == 6
    question = engine.tokenize(" Which state does it keep?")
    tokens, cached = _answer(engine, ids + question, "a")
    assert cached == 96
    back = engine.stored_blocks(first.prefix_hash)
    assert back is not None
    assert all(torch.equal(x.data, y) for x, y in zip(back, kept, strict=True))
    cold = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1))
    assert _answer(cold, ids + question, "a")[0] == tokens
