"""The worker's boot warmup on the real SmolLM2: the seed's token amount, nothing cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.boot import warm_engine
from workers.engines.torch_engine import load_torch_engine
from workers.kv.budgets import CPU_BANDWIDTH, boot_warmup_tokens
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration


def test_the_engine_warms_the_seeds_amount_and_caches_nothing(model_path: Path) -> None:
    engine = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1))
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    # SmolLM2-135M in float32 on a CPU: the bandwidth term (about 47 tokens) wins over a
    # quarter of its 8k context; it names no quantization.
    expected = boot_warmup_tokens(engine.max_model_len, CPU_BANDWIDTH, weights, "none")
    assert engine.boot_warmup_tokens == expected
    assert 0 < expected < engine.max_model_len // 4
    assert warm_engine(engine, engine.boot_warmup_tokens) > 0
    assert len(engine.cache) == 0 and engine.memory().used == 0


def test_the_warmup_follows_the_settings(model_path: Path) -> None:
    off = load_torch_engine(model_path, WorkerSettings(device="cpu", threads=1, boot_warmup=False))
    assert off.boot_warmup_tokens == 0
    assert warm_engine(off, 0) == 0.0
    fast = WorkerSettings(device="cpu", threads=1, memory_bandwidth=1e15)
    engine = load_torch_engine(model_path, fast)
    assert engine.boot_warmup_tokens == engine.max_model_len // 4  # the context rule
