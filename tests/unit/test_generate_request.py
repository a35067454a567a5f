"""`GenerateRequest`: a bad request fails where it is built, and the value cannot change."""

from __future__ import annotations

import dataclasses

import pytest

from workers.cost_engine import CostEngine, CostModel
from workers.engines.protocol import GenerateRequest
from workers.kv.cache import PrefixCache
from workers.kv.chunk_kv import ChunkSpan
from workers.kv.memory import Budget


def test_bad_requests_fail_when_built() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        GenerateRequest([1, 2], max_tokens=0, tenant="t")
    with pytest.raises(ValueError, match="prompt token"):
        GenerateRequest([], max_tokens=1, tenant="t")
    with pytest.raises(ValueError, match="before the prompt's last token"):
        GenerateRequest([1, 2, 3], max_tokens=1, tenant="t",
                        chunks=[ChunkSpan(("d", "v1"), 0, 3)])


def test_a_request_holds_tuples_and_is_frozen() -> None:
    prompt, stops = [1, 2, 3], [7]
    request = GenerateRequest(prompt, max_tokens=1, tenant="t", stop_ids=stops)
    prompt.append(4)
    stops.append(8)
    assert request.token_ids == (1, 2, 3) and request.stop_ids == (7,)
    assert GenerateRequest([1], max_tokens=1, tenant="t").stop_ids is None  # the model's EOS
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.max_tokens = 2  # type: ignore[misc]


def test_an_engine_answers_a_request() -> None:
    cache = PrefixCache(Budget(1 << 20, 100, 1 << 20), policy="lru", block_size=16)
    engine = CostEngine(CostModel(1.0, 1.0), cache, model_id="m", kv_bytes_per_token=10)
    request = GenerateRequest(list(range(40)), max_tokens=1, tenant="t", cache_prompt=True)
    cold = list(engine.generate(request))[-1].result
    warm = list(engine.generate(request))[-1].result
    assert cold is not None and cold.cached_tokens == 0 and cold.stored is not None
    assert warm is not None and warm.cached_tokens == 32  # the two full blocks it kept
