"""In-process vLLM with prefix caching behind the engine protocol (GPU hosts with vllm only)."""

from __future__ import annotations

import pytest

from workers.engines.protocol import GenerateRequest
from workers.engines.vllm_engine import NEEDS, vllm_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not vllm_available(), reason=NEEDS),
]

CONTEXT = (
    "You answer from the notes.\n"
    "Note 1: The ferry leaves the harbour at seven and returns at noon.\n"
    "Note 2: On Sundays it runs twice, at seven and at three.\n"
)
QUESTION = "Question: when does the Sunday ferry leave?\nAnswer:"


@pytest.fixture(scope="module")
def engine():
    from ragwarm.models import llm_dir
    from workers.engines.vllm_engine import load_vllm_engine
    from workers.settings import WorkerSettings

    settings = WorkerSettings(
        engine="vllm",
        model_id="smollm2-135m-instruct",
        vllm_gpu_memory_utilization=0.3,
        vllm_max_model_len=4096,
    )
    return load_vllm_engine(llm_dir(), settings)


def test_warmup_is_reused_and_output_matches_cold(engine) -> None:
    prefix, question = engine.tokenize(CONTEXT), engine.tokenize(QUESTION)
    request = GenerateRequest(prefix + question, max_tokens=12, tenant="t")
    engine.clear()
    cold = list(engine.generate(request))[-1].result
    engine.clear()  # reset_prefix_cache: nothing of the cold run survives
    result = engine.prefill(prefix, tenant="t", pin=True)
    full = len(prefix) // engine.block_size * engine.block_size
    assert (result.n_tokens, result.computed_tokens) == (full, full)
    warm = list(engine.generate(request))[-1].result
    assert cold is not None and warm is not None
    assert cold.cached_tokens == 0 and warm.cached_tokens >= full
    assert warm.token_ids == cold.token_ids  # greedy: the same answer warm or cold


def test_invalidation_frees_bookkeeping_only(engine) -> None:
    ref = ("ferry#1", "ab" * 16)
    result = engine.prefill(engine.tokenize(CONTEXT), tenant="u", chunk_refs=[ref])
    removed = engine.cache.invalidate([ref])
    assert [e.prefix_hash for e in removed] == [result.prefix_hash]
    assert engine.sync() == result.nbytes and result.prefix_hash not in engine.cache
