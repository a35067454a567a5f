"""The torch engine on the real SmolLM2 copy: prefix reuse is exact and never mutates the cache."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ragwarm.settings import TRACE_DIR
from workers.engines.protocol import Engine, GenerateRequest, GenerationStep
from workers.engines.torch_engine import KV, TorchEngine, load_torch_engine
from workers.kv.cache import PrefixCache
from workers.kv.memory import Budget
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

EVENTS = TRACE_DIR / "events.jsonl"
FALLBACK_TEXT = (
    "Argo CD is a declarative, GitOps continuous delivery tool for Kubernetes. "
    "Applications are defined as Kubernetes manifests kept in a Git repository. "
)
QUESTION = "\nQuestion: What does Argo CD deploy? Answer:"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def doc_tokens(shared_engine: TorchEngine) -> list[int]:
    text = FALLBACK_TEXT * 20
    if EVENTS.is_file():
        with EVENTS.open() as lines:
            text = next(
                e["text"] for e in map(json.loads, lines) if len(e.get("text") or "") > 2000
            )
    return shared_engine.tokenize(text)[:200]


def _run(
    engine: TorchEngine, prompt: list[int], tenant: str = "t", **kw: object
) -> list[GenerationStep]:
    request = GenerateRequest(prompt, max_tokens=MAX_TOKENS, tenant=tenant, **kw)  # type: ignore[arg-type]
    return list(engine.generate(request))


def _cold(engine: TorchEngine, prompt: list[int]) -> list[int]:
    steps = _run(engine, prompt, tenant="cold-" + str(len(prompt)))
    result = steps[-1].result
    assert result is not None and result.cached_tokens == 0
    return list(result.token_ids)


def _snapshot(kv: KV | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    assert kv is not None
    return [(k.clone(), v.clone()) for k, v in kv]


def _unchanged(before: list[tuple[torch.Tensor, torch.Tensor]], kv: KV | None) -> bool:
    assert kv is not None
    return all(
        torch.equal(a, k) and torch.equal(b, v) for (a, b), (k, v) in zip(before, kv, strict=True)
    )


def test_engine_satisfies_the_protocol(engine: TorchEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.kv_bytes_per_token > 0
    assert (engine.max_model_len, engine.vocab_size) == (8192, 49152)  # SmolLM2-135M
    assert engine.detokenize(engine.tokenize("Argo CD syncs apps.")) == "Argo CD syncs apps."


def test_warm_greedy_output_equals_cold(engine: TorchEngine, doc_tokens: list[int]) -> None:
    prefix, question = doc_tokens[:100], engine.tokenize(QUESTION)
    cold = _cold(engine, prefix + question)
    stored = engine.prefill(prefix, tenant="t")
    assert stored.n_tokens == 96 and stored.computed_tokens == 96
    steps = _run(engine, prefix + question)
    result = steps[-1].result
    assert result is not None
    assert list(result.token_ids) == cold
    assert result.cached_tokens == stored.n_tokens
    assert result.prefix_hash == stored.prefix_hash
    assert "".join(s.text for s in steps) == result.text == engine.tokenizer.decode(cold)


def test_generate_leaves_stored_kv_untouched(engine: TorchEngine, doc_tokens: list[int]) -> None:
    stored = engine.prefill(doc_tokens[:64], tenant="t")
    assert stored.prefix_hash is not None
    blocks = engine.stored_blocks(stored.prefix_hash)
    before = _snapshot(engine.stored_kv(stored.prefix_hash))
    _run(engine, doc_tokens[:64] + engine.tokenize(QUESTION))
    _run(engine, doc_tokens[:40])  # a partial match reads the same block tensors
    after = engine.stored_blocks(stored.prefix_hash)
    assert blocks is not None and after is not None and len(blocks) == 4
    assert all(a is b for a, b in zip(after, blocks, strict=True))
    kv = engine.stored_kv(stored.prefix_hash)
    assert _unchanged(before, kv) and kv is not None
    assert all(k.shape[-2] == 64 for k, _ in kv)


def test_partial_match_reuses_matched_blocks_only(
    engine: TorchEngine, doc_tokens: list[int]
) -> None:
    engine.prefill(doc_tokens[:96], tenant="t")
    prompt = doc_tokens[:50] + engine.tokenize(QUESTION)
    cold = _cold(engine, prompt)
    result = _run(engine, prompt)[-1].result
    assert result is not None
    assert result.cached_tokens == 48
    assert list(result.token_ids) == cold


def test_whole_prompt_cached_still_computes_the_last_token(
    engine: TorchEngine, doc_tokens: list[int]
) -> None:
    prompt = doc_tokens[:64]
    cold = _cold(engine, prompt)
    engine.prefill(prompt, tenant="t")
    result = _run(engine, prompt)[-1].result
    assert result is not None
    assert result.cached_tokens == 63
    assert list(result.token_ids) == cold


def test_prefill_reuses_a_cached_shorter_prefix(engine: TorchEngine, doc_tokens: list[int]) -> None:
    first = engine.prefill(doc_tokens[:32], tenant="t")
    longer = engine.prefill(doc_tokens[:80], tenant="t")
    again = engine.prefill(doc_tokens[:80], tenant="t")
    shorter = engine.prefill(doc_tokens[:48], tenant="t")  # inside `longer`: sliced, no compute
    assert (first.computed_tokens, longer.computed_tokens) == (32, 48)
    assert (again.computed_tokens, shorter.computed_tokens) == (0, 0)
    assert longer.nbytes == 80 * engine.kv_bytes_per_token
    assert shorter.nbytes == 48 * engine.kv_bytes_per_token
    # One chain of 5 blocks; the first 3 are held by two or three prefixes, counted once.
    assert engine.memory().used == longer.nbytes
    assert engine.cache.block_stats().shared_blocks == 3


def test_tenants_never_share_a_prefix(engine: TorchEngine, doc_tokens: list[int]) -> None:
    engine.prefill(doc_tokens[:64], tenant="a")
    result = _run(engine, doc_tokens[:64] + engine.tokenize(QUESTION), tenant="b")[-1].result
    assert result is not None and result.cached_tokens == 0 and result.prefix_hash is None


def test_invalidate_frees_the_kv_and_the_next_generate_misses(
    engine: TorchEngine, doc_tokens: list[int]
) -> None:
    refs = [("docs/faq.md#0", "c0ffee")]
    stored = engine.prefill(doc_tokens[:64], tenant="t", chunk_refs=refs, pin=True)
    assert engine.memory().used == stored.nbytes > 0
    removed = engine.cache.invalidate(refs)
    assert [e.prefix_hash for e in removed] == [stored.prefix_hash]
    assert engine.sync() == stored.nbytes
    assert engine.memory().used == 0 and stored.prefix_hash is not None
    assert engine.stored_kv(stored.prefix_hash) is None
    result = _run(engine, doc_tokens[:64] + engine.tokenize(QUESTION))[-1].result
    assert result is not None and result.cached_tokens == 0


def test_eviction_by_the_budget_drops_the_kv(
    load_engine: Callable[..., TorchEngine], doc_tokens: list[int]
) -> None:
    entry_bytes = 32 * 23040  # 32 tokens of SmolLM2-135M KV, stored in fp16 by default
    cache = PrefixCache(Budget(max_bytes=entry_bytes * 3 // 2, max_entries=8, warm_bytes=0))
    small = load_engine(cache=cache)
    assert small.kv_bytes_per_token == 23040
    first = small.prefill(doc_tokens[:32], tenant="t")
    second = small.prefill(doc_tokens[40:72], tenant="t")
    assert [e.prefix_hash for e in second.evicted] == [first.prefix_hash]
    assert first.prefix_hash is not None and small.stored_kv(first.prefix_hash) is None
    # Only the room needed was freed, the first prefix's last block: its first block stays.
    assert small.memory().used == second.nbytes + entry_bytes // 2


def test_short_prompt_stores_nothing(engine: TorchEngine) -> None:
    result = engine.prefill([1, 2, 3], tenant="t")
    assert result.prefix_hash is None and result.n_tokens == 0 and engine.memory().used == 0


def test_stop_ids_end_the_generation(engine: TorchEngine, doc_tokens: list[int]) -> None:
    prompt = doc_tokens[:20]
    first = _cold(engine, prompt)[0]
    steps = _run(engine, prompt, stop_ids=[first])
    result = steps[-1].result
    assert len(steps) == 1 and steps[0].token_id == first
    assert result is not None and result.finish_reason == "stop" and result.token_ids == ()
    assert _run(engine, prompt)[-1].result.finish_reason == "length"  # type: ignore[union-attr]


def test_bad_arguments_fail_at_the_call(engine: TorchEngine) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate(GenerateRequest([1, 2], max_tokens=0, tenant="t"))
    with pytest.raises(ValueError, match="prompt token"):
        engine.generate(GenerateRequest([], max_tokens=1, tenant="t"))


@pytest.mark.parametrize("length", [100, 64])  # a partial last block (copied), or none (kept)
def test_cache_prompt_stores_the_prompt_from_its_own_kv(
    engine: TorchEngine, doc_tokens: list[int], length: int
) -> None:
    prompt, aligned = doc_tokens[:length], length // 16 * 16
    cold = _cold(engine, prompt)
    steps = engine.generate(
        GenerateRequest(prompt, max_tokens=MAX_TOKENS, tenant="t", cache_prompt=True)
    )
    first = [next(steps), next(steps)]  # the prompt is stored once the first token is out
    assert len(engine.cache) == 1
    (entry,) = engine.cache.entries()
    kv = engine.stored_kv(entry.prefix_hash)
    at_store = _snapshot(kv)
    result = [*first, *steps][-1].result
    assert result is not None and list(result.token_ids) == cold and result.cached_tokens == 0
    stored = result.stored
    assert stored is not None and stored.prefix_hash == entry.prefix_hash
    assert (stored.n_tokens, stored.computed_tokens) == (aligned, aligned)
    assert stored.nbytes == aligned * engine.kv_bytes_per_token == entry.nbytes
    assert kv is not None and all(k.shape[-2] == aligned for k, _ in kv)
    assert _unchanged(at_store, kv)  # the decode steps after storing did not touch it

    again = _run(engine, prompt, cache_prompt=True)[-1].result
    assert again is not None and list(again.token_ids) == cold
    assert again.cached_tokens == min(aligned, length - 1) and again.stored is None
    assert again.prefix_hash == stored.prefix_hash
    _run(engine, doc_tokens[: length + 40], cache_prompt=True)  # stores an extension
    assert len(engine.cache) == 2 and _unchanged(at_store, engine.stored_kv(entry.prefix_hash))

    fresh = engine.prefill(prompt, tenant="fresh")
    assert fresh.prefix_hash is not None and fresh.computed_tokens == aligned
    for (k, v), (fk, fv) in zip(kv, engine.stored_kv(fresh.prefix_hash) or (), strict=True):
        assert torch.allclose(k, fk, atol=1e-5) and torch.allclose(v, fv, atol=1e-5)


def test_cache_prompt_extends_a_cached_prefix(engine: TorchEngine, doc_tokens: list[int]) -> None:
    base = engine.prefill(doc_tokens[:32], tenant="t")
    prompt = doc_tokens[:100] + engine.tokenize(QUESTION)
    cold = _cold(engine, prompt)
    result = _run(engine, prompt, cache_prompt=True, chunk_refs=[("d#0", "h0")], ttl_s=60)[
        -1
    ].result
    assert result is not None and list(result.token_ids) == cold and result.cached_tokens == 32
    stored = result.stored
    aligned = len(prompt) // 16 * 16
    assert stored is not None and (stored.n_tokens, stored.computed_tokens) == (
        aligned,
        aligned - 32,
    )
    entry = next(e for e in engine.cache.entries() if e.prefix_hash == stored.prefix_hash)
    assert entry.chunk_refs == {("d#0", "h0")} and not entry.pinned
    assert base.prefix_hash in {e.prefix_hash for e in engine.cache.entries()}


def test_cache_prompt_adds_nothing_inside_a_longer_entry(
    engine: TorchEngine, doc_tokens: list[int]
) -> None:
    engine.prefill(doc_tokens[:96], tenant="t")
    result = _run(engine, doc_tokens[:50], cache_prompt=True)[-1].result
    assert result is not None and result.cached_tokens == 48 and result.stored is None
    assert len(engine.cache) == 1


def test_cache_prompt_refused_by_the_budget_still_answers(
    shared_engine: TorchEngine, doc_tokens: list[int]
) -> None:
    one_block = 16 * shared_engine.kv_bytes_per_token
    tight = TorchEngine(
        shared_engine.model,
        shared_engine.tokenizer,
        model_id=shared_engine.model_id,
        settings=WorkerSettings(device="cpu", threads=1),
        cache=PrefixCache(Budget(max_bytes=one_block, max_entries=8, warm_bytes=0)),
    )
    prompt = doc_tokens[:100]
    result = _run(tight, prompt, cache_prompt=True)[-1].result
    assert result is not None and result.stored is None
    assert list(result.token_ids) == _cold(shared_engine, prompt)
    assert len(tight.cache) == 0 and tight.memory().used == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_warm_equals_cold_on_cuda(model_path: Path, doc_tokens: list[int]) -> None:
    gpu = load_torch_engine(model_path, WorkerSettings(device="cuda", dtype="float32"))
    prompt = doc_tokens[:100] + gpu.tokenize(QUESTION)
    cold = _cold(gpu, prompt)
    gpu.prefill(doc_tokens[:100], tenant="t")
    result = _run(gpu, prompt)[-1].result
    assert result is not None and result.cached_tokens == 96
    assert list(result.token_ids) == cold
