"""Chunk KV in the block store: stored as the prefix `opening + chunk`, so the exact lookup
of any prompt opening with the chunk reuses it; invalidated with every prefix through it."""

from __future__ import annotations

import pytest

from workers.kv.blocks import BLOCK_SIZE, block_hashes
from workers.kv.cache import Budget, PrefixCache
from workers.kv.chunk_kv import ChunkSpan, check_spans, chunk_prefix, held_chunk_tokens, plan_pieces

OPENING = list(range(1000, 1020))  # a 20-token system prompt: its last block holds chunk tokens
OLD = ("doc#0", "hash-old")
NEW = ("doc#0", "hash-new")
OTHER = ("doc#1", "hash-1")
QUESTION = list(range(9000, 9030))
BYTES_PER_BLOCK = 64


def chunk_tokens(seed: int, n: int = 2 * BLOCK_SIZE) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def chunk_chain(tokens: list[int], tenant: str = "t", model: str = "m") -> list[str]:
    return block_hashes(chunk_prefix(OPENING, tokens), tenant=tenant, model=model)


def held_chunk(cache: PrefixCache, ref: tuple[str, str], tokens: list[int]) -> list[str]:
    """What `Engine.prefill_chunk` stores for a chunk (the engines' shared `_prefill`)."""
    hashes = chunk_chain(tokens)
    cache.admit(tenant="t", hashes=hashes, nbytes=BYTES_PER_BLOCK * len(hashes),
                chunk_refs=[ref], chunk_starts={ref: len(OPENING)})
    return hashes


def make_cache() -> PrefixCache:
    return PrefixCache(Budget(max_bytes=1 << 20, max_entries=100, warm_bytes=1 << 19))


def test_a_prompt_opening_with_a_held_chunk_reuses_it_by_the_exact_lookup() -> None:
    cache = make_cache()
    c0, c1 = chunk_tokens(1), chunk_tokens(2)
    held = held_chunk(cache, OLD, c0)
    # A question never asked before whose first chunk is c0: system + c0's full blocks.
    prompt = OPENING + c0 + c1 + QUESTION
    entry, matched = cache.lookup(block_hashes(prompt, tenant="t", model="m"))
    assert matched == len(held) == (len(OPENING) + len(c0)) // BLOCK_SIZE
    assert entry is not None and entry.chunk_refs == {OLD}
    # Whose first chunk is another: only the opening's full blocks.
    other = OPENING + c1 + c0 + QUESTION
    assert cache.peek(block_hashes(other, tenant="t", model="m"))[1] == len(OPENING) // BLOCK_SIZE


def test_chunk_kv_and_a_cached_prompt_share_their_blocks_once() -> None:
    cache = make_cache()
    c0, c1 = chunk_tokens(1), chunk_tokens(2)
    prompt = block_hashes(OPENING + c0 + c1 + QUESTION, tenant="t", model="m")
    cache.admit(tenant="t", hashes=prompt, nbytes=BYTES_PER_BLOCK * len(prompt), kind="request")
    held = held_chunk(cache, OLD, c0)
    assert set(held) <= set(prompt)
    assert cache.bytes_used == BYTES_PER_BLOCK * len(prompt)  # nothing new stored


def test_invalidating_a_chunk_ref_removes_its_chunk_kv_and_every_prefix_through_it() -> None:
    cache = make_cache()
    c0, c1 = chunk_tokens(1), chunk_tokens(2)
    chunk0 = held_chunk(cache, OLD, c0)
    chunk1 = held_chunk(cache, OTHER, c1)
    prompt = OPENING + c0 + c1
    prefix = block_hashes(prompt, tenant="t", model="m")
    cache.admit(tenant="t", hashes=prefix, nbytes=64 * len(prefix), chunk_refs=[OLD, OTHER],
                chunk_starts={OLD: len(OPENING), OTHER: len(OPENING) + len(c0)})
    cache.drain_events()

    removed = cache.invalidate([OLD])

    assert {e.prefix_hash for e in removed} == {chunk0[-1], prefix[-1]}
    opening_blocks = len(OPENING) // BLOCK_SIZE
    # From the block holding the chunk's first token on, nothing is left; the system
    # prompt's full blocks stay (the other chunk's entry holds them).
    assert not any(h in cache.pool for h in chunk0[opening_blocks:])
    assert cache.peek(prefix)[1] == opening_blocks
    assert cache.peek(chunk1)[1] == len(chunk1)  # the other chunk's KV is untouched
    assert {e.kind for e in cache.drain_events()} >= {"invalidated"}


def test_a_changed_chunk_has_other_hashes_and_is_never_reused() -> None:
    cache = make_cache()
    tokens = chunk_tokens(1)
    held_chunk(cache, OLD, tokens)
    # The chunk's text changed at its start: nothing of the old KV past the opening matches
    # (hashes are over token ids; leading blocks of unchanged tokens would be exact KV).
    edited = [7, *tokens[1:]]
    assert cache.peek(chunk_chain(edited))[1] == len(OPENING) // BLOCK_SIZE
    assert held_chunk_tokens(len(OPENING), len(OPENING) // BLOCK_SIZE, BLOCK_SIZE) == 0


@pytest.mark.parametrize(("tenant", "model"), [("t2", "m"), ("t", "m2")])
def test_chunk_kv_is_salted_by_tenant_and_model_like_any_prompt(tenant: str,
                                                                 model: str) -> None:
    tokens = chunk_tokens(1)
    assert not set(chunk_chain(tokens)) & set(chunk_chain(tokens, tenant, model))


def test_held_chunk_tokens_count_only_whole_blocks_past_the_opening() -> None:
    assert held_chunk_tokens(20, 3, 16) == 28
    assert held_chunk_tokens(20, 1, 16) == 0
    assert held_chunk_tokens(32, 2, 16) == 0


def test_plan_places_the_held_parts_after_the_exact_prefix() -> None:
    spans = [ChunkSpan(OLD, 20, 60), ChunkSpan(OTHER, 60, 100)]
    # 48 exact tokens: chunk 0 is covered up to 48 and holds 32 of its 40 tokens.
    plans = plan_pieces(spans, 48, {OLD: 32, OTHER: 32})
    assert [(p.offset, p.start, p.count) for p in plans] == [(28, 48, 4), (0, 60, 32)]
    # A chunk held for fewer tokens than the exact part covers gives nothing.
    assert [p.span.ref for p in plan_pieces(spans, 56, {OLD: 32, OTHER: 32})] == [OTHER]
    assert plan_pieces(spans, 0, {}) == []


def test_spans_are_checked() -> None:
    with pytest.raises(ValueError, match="start < end"):
        ChunkSpan(OLD, 5, 5)
    with pytest.raises(ValueError, match="overlap"):
        check_spans([ChunkSpan(OLD, 10, 30), ChunkSpan(OTHER, 20, 40)], 50)
    with pytest.raises(ValueError, match="last token"):
        check_spans([ChunkSpan(OLD, 10, 50)], 50)
