"""Chunk KV in the block store: keyed by content, invalidated with every prefix through it."""

from __future__ import annotations

import pytest

from workers.blocks import BLOCK_SIZE, block_hashes
from workers.cache import Budget, PrefixCache
from workers.chunk_kv import ChunkSpan, check_spans, chunk_hashes, plan_pieces

OPENING = list(range(1000, 1020))  # a 20-token system prompt
OLD = ("doc#0", "hash-old")
NEW = ("doc#0", "hash-new")
OTHER = ("doc#1", "hash-1")


def chunk_tokens(seed: int, n: int = 2 * BLOCK_SIZE) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def held_chunk(cache: PrefixCache, ref: tuple[str, str], tokens: list[int]) -> list[str]:
    hashes = chunk_hashes(tokens, tenant="t", model="m", opening=OPENING, ref=ref,
                          block_size=BLOCK_SIZE)
    cache.admit(tenant="t", hashes=hashes, nbytes=64 * len(hashes), chunk_refs=[ref],
                chunk_starts={ref: 0})
    return hashes


def make_cache() -> PrefixCache:
    return PrefixCache(Budget(max_bytes=1 << 20, max_entries=100, warm_bytes=1 << 19))


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
    assert not any(h in cache.pool for h in chunk0)
    # Blocks after the chunk's start are gone; the system prompt's first block stays.
    assert cache.peek(prefix)[1] == len(OPENING) // BLOCK_SIZE
    assert cache.peek(chunk1)[1] == len(chunk1)  # the other chunk's KV is untouched
    assert {e.kind for e in cache.drain_events()} >= {"invalidated"}


def test_a_changed_chunk_has_other_hashes_and_is_never_reused() -> None:
    cache = make_cache()
    tokens = chunk_tokens(1)
    held_chunk(cache, OLD, tokens)
    # Same chunk id, same tokens, new content hash: nothing of the old KV matches.
    new = chunk_hashes(tokens, tenant="t", model="m", opening=OPENING, ref=NEW,
                       block_size=BLOCK_SIZE)
    assert cache.peek(new) == (None, 0)


@pytest.mark.parametrize(
    ("tenant", "model", "opening"),
    [("t2", "m", OPENING), ("t", "m2", OPENING), ("t", "m", OPENING[:-1])],
)
def test_chunk_kv_is_salted_by_tenant_model_and_what_it_follows(
    tenant: str, model: str, opening: list[int]
) -> None:
    tokens = chunk_tokens(1)
    base = chunk_hashes(tokens, tenant="t", model="m", opening=OPENING, ref=OLD,
                        block_size=BLOCK_SIZE)
    other = chunk_hashes(tokens, tenant=tenant, model=model, opening=opening, ref=OLD,
                         block_size=BLOCK_SIZE)
    assert not set(base) & set(other)
    # The chunk's KV never collides with the prompt's own prefix chain either.
    assert not set(base) & set(block_hashes(OPENING + tokens, tenant="t", model="m"))


def test_same_content_under_another_chunk_id_shares_the_kv() -> None:
    tokens = chunk_tokens(1)
    a = chunk_hashes(tokens, tenant="t", model="m", opening=OPENING, ref=("a#0", "h"),
                     block_size=BLOCK_SIZE)
    b = chunk_hashes(tokens, tenant="t", model="m", opening=OPENING, ref=("b#3", "h"),
                     block_size=BLOCK_SIZE)
    assert a == b


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
