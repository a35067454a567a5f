"""`reset()`: an engine drops every cached prefix and frees its KV (the model-free engine,
which keeps the bookkeeping every engine shares)."""

from __future__ import annotations

from workers.cost_engine import CostEngine, CostModel, make_cache
from workers.kv.memory import Budget


def _engine() -> CostEngine:
    cache = make_cache(Budget(1 << 20, 100, 1 << 20), lambda: 0.0, block_size=16)
    return CostEngine(CostModel(1.0, 1.0), cache, model_id="m", kv_bytes_per_token=10)


def test_reset_drops_every_prefix_and_frees_its_kv() -> None:
    engine = _engine()
    first = engine.prefill(list(range(40)), tenant="t")  # two full blocks
    engine.prefill(list(range(100, 116)), tenant="u")  # one
    assert first.prefix_hash in engine.cache and engine.memory().used == 48 * 10
    assert engine.reset() == 48 * 10
    assert engine.memory().used == 0 and first.prefix_hash not in engine.cache
    assert engine.reset() == 0  # nothing left to free


def test_a_reset_engine_computes_the_prefix_again() -> None:
    engine = _engine()
    engine.prefill(list(range(40)), tenant="t")
    engine.reset()
    again = engine.prefill(list(range(40)), tenant="t")
    assert again.computed_tokens == 32
