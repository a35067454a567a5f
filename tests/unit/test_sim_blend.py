"""The model-free cost engine blends like the torch engine: the chunks of every prompt it
stores are donated, a prompt never asked blends them where that is cheaper than computing
it, and a changed chunk is never blended again."""

from __future__ import annotations

from dataclasses import replace

import pytest

from workers.cost_engine import CostEngine, CostModel, moved_cost
from workers.engines.protocol import GenerateRequest
from workers.kv.blend_cost import BlendCosts
from workers.kv.blocks import BLOCK_SIZE
from workers.kv.cache import Budget, PrefixCache
from workers.kv.chunk_kv import ChunkSpan

OPENING = list(range(1000, 1020))
REFS = [("d#0", "a"), ("d#1", "b"), ("d#2", "c")]
CHUNKS = [[(i + 1) * 10_000 + t for t in range(5 * BLOCK_SIZE + 3)] for i in range(3)]


COST = CostModel(100.0, 1.0)


def make_engine(cost: CostModel = COST, *, explore_ratio: float = 1.0) -> CostEngine:
    """By default it tries any blend computing fewer tokens than the cold prefill (the
    worker's first guess tries only those computing at most half: tested below)."""
    cache = PrefixCache(Budget(max_bytes=1 << 30, max_entries=1000, warm_bytes=1 << 29))
    engine = CostEngine(cost, cache, model_id="m", kv_bytes_per_token=1)
    engine.blend_costs = BlendCosts(explore_ratio=explore_ratio)
    return engine


def prompt(order: list[int], question: int) -> tuple[list[int], list[ChunkSpan]]:
    tokens, spans = list(OPENING), []
    for i in order:
        spans.append(ChunkSpan(REFS[i], len(tokens), len(tokens) + len(CHUNKS[i])))
        tokens += CHUNKS[i]
    return tokens + [90_000 + question] * 12, spans


def ask(engine: CostEngine, order: list[int], question: int, *, keep: bool = False,
        reuse: bool = True):
    ids, spans = prompt(order, question)
    steps = list(engine.generate(GenerateRequest(ids, max_tokens=1, tenant="t",
                                                 cache_prompt=keep, chunks=spans,
                                                 chunk_reuse=reuse)))
    return steps[-1].result


def test_a_question_never_asked_blends_the_chunks_other_prompts_computed() -> None:
    engine = make_engine()
    # Each chunk computed in another prompt (each first there, after the opening).
    for q, i in enumerate(range(3)):
        assert ask(engine, [i], q, keep=True).blended_tokens == 0
    new = ask(engine, [2, 0, 1], 9)
    # Chunk 2 opens the prompt as it opened its donor: the exact prefix covers its whole
    # blocks; every chunk token after them (its tail, chunks 0 and 1) is blended.
    assert new.cached_tokens == (len(OPENING) + len(CHUNKS[2])) // BLOCK_SIZE * BLOCK_SIZE
    chunk_tokens = sum(map(len, CHUNKS))
    held = chunk_tokens - (new.cached_tokens - len(OPENING))
    assert new.blended_tokens == held
    cold = ask(engine, [2, 0, 1], 9, reuse=False)
    assert cold.blended_tokens == 0 and new.ttft_s < cold.ttft_s
    assert engine.chunk_kv_available(*prompt([2, 0, 1], 9), tenant="t",
                                     cached=new.cached_tokens) == (held, held)


def test_a_changed_chunk_is_never_blended_again() -> None:
    engine = make_engine()
    ask(engine, [0, 1, 2], 0, keep=True)
    before = ask(engine, [2, 1, 0], 1).blended_tokens
    engine.invalidate([REFS[1]], tenant="t")
    after = ask(engine, [2, 1, 0], 1)
    assert 0 < after.blended_tokens < before
    ids, spans = prompt([2, 1, 0], 1)
    donors = engine.chunk_donors("t", ids, spans, 0)
    assert REFS[1] not in donors and REFS[0] in donors


def test_blends_are_decided_as_the_worker_decides_them() -> None:
    # The worker's first guess: a blend computing more than half the cold tokens is not
    # tried (at the shipped share of 0.9 none is).
    engine = make_engine(replace(COST, recompute_share=0.9), explore_ratio=0.5)
    ask(engine, [0, 1, 2], 0, keep=True)
    result = ask(engine, [2, 1, 0], 1)
    assert result.blended_tokens == 0
    assert result.ttft_s == COST.ttft_ms(result.prompt_tokens, result.cached_tokens) / 1000
    # At 0.3 it is tried; blends turn out slower than computing (1.2 of a computed token
    # per moved one): once two of different sizes were timed, no more is run.
    engine = make_engine(replace(COST, moved_share=1.2), explore_ratio=0.5)
    ask(engine, [0, 1, 2], 0, keep=True)
    explored = [ask(engine, order, q).blended_tokens for q, order in
                enumerate(([2, 1, 0], [0, 2, 1]), start=1)]
    assert explored[0] > explored[1] > 0 and engine.blend_costs.learned
    result = ask(engine, [1, 2, 0], 3)
    assert result.blended_tokens == 0
    assert result.ttft_s == COST.ttft_ms(result.prompt_tokens, result.cached_tokens) / 1000


def test_the_cost_of_a_moved_token_is_what_the_share_computes() -> None:
    assert moved_cost(0.3) == COST.moved_share == pytest.approx(0.378, abs=1e-3)
    assert moved_cost(0.9) > 0.9  # it recomputes 90% and checks the rest at three layers
    assert COST.for_share(0.9).moved_share == moved_cost(0.9)
    assert COST.for_share(0.9).recompute_share == 0.9


def test_a_blended_prompt_is_stored_and_a_later_ask_reads_its_approximate_blocks() -> None:
    engine = make_engine()
    ask(engine, [0, 1, 2], 0, keep=True)
    blended = ask(engine, [2, 1, 0], 1, keep=True)
    assert blended.blended_tokens > 0 and blended.stored is not None
    again = ask(engine, [2, 1, 0], 1)
    assert again.blended_tokens == 0 and again.cached_tokens > blended.cached_tokens
    # Its exact head (the opening and chunk 2's whole blocks) was exact before the blend;
    # every cached token after it is the blend's.
    assert again.approx_cached_tokens == again.cached_tokens - blended.cached_tokens
    assert blended.approx_cached_tokens == 0


def test_a_blended_prompt_donates_only_its_exact_head() -> None:
    engine = make_engine()
    first = ask(engine, [0, 1, 2], 0, keep=True)
    blended = ask(engine, [2, 1, 0], 1, keep=True)
    assert blended.cached_tokens == BLOCK_SIZE  # only the opening's first block was exact
    ids, spans = prompt([1, 0, 2], 2)
    assert len(engine.chunk_donors("t", ids, spans, 0)) == 3  # in the exact prompt
    # The exact prompt leaves: only the blend still holds the chunks' KV, and none of it
    # is exact.
    engine.cache.evict([e.prefix_hash for e in engine.cache.entries()
                        if e.prefix_hash != blended.stored.prefix_hash])
    engine.sync()
    assert first.stored.prefix_hash not in engine.cache
    assert engine.chunk_donors("t", ids, spans, 0) == {}
    assert ask(engine, [1, 0, 2], 2).blended_tokens == 0
