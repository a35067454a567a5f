"""The torch engine's chunk KV on the real SmolLM2: stored as the prefix `opening + chunk`, so
a prompt opening with the chunk reuses it exactly (chunk reuse off); blended after the exact
prefix when chunk reuse is on, never when a request opts out or the chunk changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from ragwarm.models import fetch_llm
from workers.engines.blend import prefill
from workers.engines.protocol import GenerateRequest
from workers.engines.torch_engine import TorchEngine, load_torch_engine
from workers.kv.chunk_kv import ChunkSpan
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

OPENING = "<|im_start|>system\nAnswer from the context.\n\nContext:\n"
CHUNKS = (
    "\n[a#0]\nArgo CD is a declarative, GitOps continuous delivery tool for Kubernetes. It "
    "watches Git repositories and compares the desired state with the live state.\n",
    "\n[b#0]\nApplications are defined as Kubernetes manifests kept in a Git repository, as "
    "Helm charts, Kustomize applications or plain YAML directories.\n",
    "\n[c#0]\nA sync operation applies the desired state from Git to the live cluster, and "
    "the application becomes Synced when both agree.\n",
)
REFS = (("a#0", "ha"), ("b#0", "hb"), ("c#0", "hc"))
QUESTION = "<|im_end|>\n<|im_start|>user\nWhat does a sync do?<|im_end|>\n<|im_start|>assistant\n"
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def engine(load_engine: Callable[..., TorchEngine]) -> Iterator[TorchEngine]:
    # Share 1: every moved token is recomputed, so the blend must equal the full prefill.
    engine = load_engine(chunk_reuse=True, chunk_recompute_share=1.0, chunk_blend_gate=False)
    yield engine
    engine.reset()


@pytest.fixture
def prompt(engine: TorchEngine) -> tuple[list[int], list[list[int]], list[ChunkSpan]]:
    engine.reset()
    opening = engine.tokenize(OPENING)
    chunks = [engine.tokenize(c) for c in CHUNKS]
    spans, start = [], len(opening)
    for ref, ids in zip(REFS, chunks, strict=True):
        spans.append(ChunkSpan(ref, start, start + len(ids)))
        start += len(ids)
    ids = opening + [t for c in chunks for t in c] + engine.tokenize(QUESTION)
    return ids, [opening, *chunks], spans


def _answer(engine: TorchEngine, ids: list[int], **kw: Any) -> tuple[list[int], int]:
    steps = list(engine.generate(GenerateRequest(ids, max_tokens=MAX_TOKENS, tenant="t", **kw)))
    result = steps[-1].result
    assert result is not None
    return list(result.token_ids), result.blended_tokens


def _full(n: int, engine: TorchEngine) -> int:
    return n // engine.block_size * engine.block_size


def _warm_chunks(engine: TorchEngine, parts: list[list[int]], refs: Any = REFS) -> None:
    for ref, chunk in zip(refs, parts[1:], strict=True):
        stored = engine.prefill_chunk(parts[0], chunk, tenant="t", ref=ref)
        assert stored.n_tokens == _full(len(parts[0]) + len(chunk), engine)


def test_a_first_ask_reuses_its_warm_first_chunk_exactly_without_blending(
    prompt: Any,
) -> None:
    ids, parts, spans = prompt
    # Chunk reuse off: position 1 needs no blending, its KV is the prompt's own prefix.
    settings = WorkerSettings(device="cpu", threads=1, chunk_reuse="off")
    engine = load_torch_engine(fetch_llm(), settings)
    steps = list(engine.generate(GenerateRequest(ids, max_tokens=MAX_TOKENS, tenant="t")))
    cold = steps[-1].result
    assert cold is not None and cold.cached_tokens == 0
    engine.reset()
    stored = engine.prefill_chunk(parts[0], parts[1], tenant="t", ref=REFS[0])
    assert stored.computed_tokens == stored.n_tokens  # opening and chunk, nothing cached
    request = GenerateRequest(ids, max_tokens=MAX_TOKENS, tenant="t", chunks=spans)
    result = list(engine.generate(request))[-1]
    warm = result.result
    assert warm is not None and warm.blended_tokens == 0
    assert warm.cached_tokens == _full(len(parts[0]) + len(parts[1]), engine) > len(parts[0])
    assert warm.token_ids == cold.token_ids
    # Invalidating the chunk's ref takes its KV; the opening's full blocks stay.
    engine.cache.invalidate([REFS[0]])
    again = list(engine.generate(GenerateRequest(ids, max_tokens=1, tenant="t")))[-1].result
    assert again is not None and again.cached_tokens == _full(len(parts[0]), engine)


def test_stored_chunk_kv_is_the_chunk_computed_after_the_opening(engine: TorchEngine,
                                                                 prompt: Any) -> None:
    _, parts, _ = prompt
    stored = engine.prefill_chunk(parts[0], parts[2], tenant="t", ref=REFS[1])
    assert stored.prefix_hash is not None and stored.computed_tokens > 0
    kv = engine.stored_kv(stored.prefix_hash)
    opening_kv, _ = prefill(engine.model, parts[0])
    expected, _ = prefill(engine.model, parts[2], opening_kv)
    assert kv is not None
    n, o = stored.n_tokens, len(parts[0])

    # Blocks are stored in the engine's KV precision (fp16 under this fp32 model): within
    # its rounding, and the chunk may be computed over the opening's rounded KV.
    tol = {"rtol": 2e-3, "atol": 2e-3}
    for (k, v), (ok, ov), (ek, ev) in zip(kv, opening_kv, expected, strict=True):
        torch.testing.assert_close(k[..., :o, :], ok, **tol)
        torch.testing.assert_close(v[..., :o, :], ov, **tol)
        torch.testing.assert_close(k[..., o:n, :], ek[..., : n - o, :], **tol)
        torch.testing.assert_close(v[..., o:n, :], ev[..., : n - o, :], **tol)
    again = engine.prefill_chunk(parts[0], parts[2], tenant="t", ref=REFS[1])
    assert again.computed_tokens == 0  # already held: a refresh


def test_blending_held_chunks_answers_like_the_full_prefill(engine: TorchEngine,
                                                            prompt: Any) -> None:
    ids, parts, spans = prompt
    cold, blended = _answer(engine, ids)
    assert blended == 0  # nothing held yet
    engine.reset()
    _warm_chunks(engine, parts)
    warm, blended = _answer(engine, ids, chunks=spans)
    assert blended > 0
    assert warm == cold


def test_a_request_can_opt_out(engine: TorchEngine, prompt: Any) -> None:
    ids, parts, spans = prompt
    _warm_chunks(engine, parts)
    _, blended = _answer(engine, ids, chunks=spans, chunk_reuse=False)
    assert blended == 0


def test_a_changed_or_invalidated_chunk_is_never_blended(engine: TorchEngine,
                                                         prompt: Any) -> None:
    ids, parts, spans = prompt
    _warm_chunks(engine, parts)
    _, all_held = _answer(engine, ids, chunks=spans)
    # The second chunk's text changed: the prompt holds its new tokens, held KV the old.
    # (From its first token on: leading tokens left as they were, such as the block's
    # `[b#0]` header, would have exact KV, which reusing is right.)
    b = spans[1]
    edited = [*ids[: b.start], *engine.tokenize("Edited chunk b."), *ids[b.end :]]
    shift = len(edited) - len(ids)
    moved = [spans[0], ChunkSpan(("b#0", "hb-new"), b.start, b.end + shift),
             ChunkSpan(spans[2].ref, spans[2].start + shift, spans[2].end + shift)]
    _, fewer = _answer(engine, edited, chunks=moved)
    o = len(parts[0])
    held_b = _full(o + len(parts[2]), engine) - o
    assert fewer == all_held - held_b
    engine.cache.invalidate([REFS[2]])
    _, after = _answer(engine, ids, chunks=spans)
    held_c = _full(o + len(parts[3]), engine) - o
    assert after == all_held - held_c
