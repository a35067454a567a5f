"""Chunk donation: every stored prompt offers its chunks' KV for blending, found by content,
checked against the blocks the cache still holds, dropped when its chunk changes."""

from __future__ import annotations

import pytest

from workers.kv.blocks import BLOCK_SIZE, block_hashes
from workers.kv.cache import Budget, PrefixCache
from workers.kv.chunk_kv import ChunkSpan, DonorIndex, chunk_content_hash, donors_of

OPENING = list(range(1000, 1020))
A, B, C = ("doc#0", "a"), ("doc#1", "b"), ("doc#2", "c")
QUESTION = list(range(9000, 9030))


def chunk(seed: int, n: int = 2 * BLOCK_SIZE) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def prompt_of(*parts: tuple[tuple[str, str], list[int]]) -> tuple[list[int], list[ChunkSpan]]:
    tokens, spans = list(OPENING), []
    for ref, body in parts:
        spans.append(ChunkSpan(ref, len(tokens), len(tokens) + len(body)))
        tokens += body
    return tokens + QUESTION, spans


def make_cache() -> PrefixCache:
    return PrefixCache(Budget(max_bytes=1 << 20, max_entries=100, warm_bytes=1 << 19))


def stored(cache: PrefixCache, index: DonorIndex, prompt: list[int],
           spans: list[ChunkSpan]) -> list[str]:
    """What an engine does when it stores a prompt: admit its blocks, donate its chunks."""
    hashes = block_hashes(prompt, tenant="t", model="m")
    cache.admit(tenant="t", hashes=hashes, nbytes=64 * len(hashes), kind="request",
                chunk_refs=[s.ref for s in spans], chunk_starts={s.ref: s.start for s in spans})
    index.donate("t", "m", prompt, spans, hashes)
    return hashes


def held_by(cache: PrefixCache):
    return lambda chain: cache.peek(chain)[1]


def test_a_chunk_computed_in_another_prompt_is_found_at_its_position_there() -> None:
    cache, index = make_cache(), DonorIndex(BLOCK_SIZE)
    a, b = chunk(1), chunk(2)
    prompt, spans = prompt_of((A, a), (B, b))
    hashes = stored(cache, index, prompt, spans)
    donor = index.find("t", "m", b, held_by(cache))
    assert donor is not None and donor.ref == B
    assert donor.start == spans[1].start  # where it was computed: the blend re-rotates from it
    assert donor.held == len(b)
    assert donor.chain == tuple(hashes[: -(-spans[1].end // BLOCK_SIZE)])
    # Keyed by the chunk's tokens and namespaced by tenant and model: nothing else matches.
    assert index.find("t", "m", b[:-1], held_by(cache)) is None
    assert index.find("u", "m", b, held_by(cache)) is None
    assert index.find("t", "other-model", b, held_by(cache)) is None


def test_donation_holds_no_bytes_of_its_own() -> None:
    cache, index = make_cache(), DonorIndex(BLOCK_SIZE)
    prompt, spans = prompt_of((A, chunk(1)), (B, chunk(2)))
    stored(cache, index, prompt, spans)
    used = cache.bytes_used
    assert len(index) == 2
    assert cache.bytes_used == used == 64 * (len(prompt) // BLOCK_SIZE)


def test_only_the_tokens_in_whole_stored_blocks_are_donated() -> None:
    # The prompt's last partial block is never stored: a chunk ending in it donates the rest.
    a = chunk(1, 2 * BLOCK_SIZE + 5)
    tokens = OPENING + a
    spans = [ChunkSpan(A, len(OPENING), len(tokens))]
    chain = block_hashes(tokens, tenant="t", model="m")
    ((_, donor),) = donors_of(spans, chain, BLOCK_SIZE)
    assert donor.held == len(chain) * BLOCK_SIZE - len(OPENING)
    assert donor.chain == tuple(chain)
    # A chunk wholly inside the partial block donates nothing.
    tail = [ChunkSpan(B, len(chain) * BLOCK_SIZE, len(chain) * BLOCK_SIZE + 3)]
    assert donors_of(tail, chain, BLOCK_SIZE) == []


def test_an_evicted_donor_is_dropped_at_lookup_and_a_cut_one_shortened() -> None:
    cache, index = make_cache(), DonorIndex(BLOCK_SIZE)
    a, b = chunk(1), chunk(2)
    prompt, spans = prompt_of((A, a), (B, b))
    hashes = stored(cache, index, prompt, spans)
    # The cache keeps only the blocks up to b's first block: b is held in part.
    keep = spans[1].start // BLOCK_SIZE + 1
    assert cache.evict([hashes[-1]])
    cache.admit(tenant="t", hashes=hashes[:keep], nbytes=64 * keep, kind="request")
    donor = index.find("t", "m", b, held_by(cache))
    assert donor is not None and donor.held == keep * BLOCK_SIZE - spans[1].start
    cache.clear()
    assert index.find("t", "m", b, held_by(cache)) is None
    assert index.find("t", "m", a, held_by(cache)) is None
    assert len(index) == 0  # each stale entry went at its lookup


def test_an_invalidated_chunk_is_never_found_again_even_where_its_blocks_survive() -> None:
    cache, index = make_cache(), DonorIndex(BLOCK_SIZE)
    a, b = chunk(1), chunk(2)
    prompt, spans = prompt_of((A, a), (B, b))
    stored(cache, index, prompt, spans)
    assert index.invalidate([B], tenant="u") == 0  # another tenant's edit reaches nothing here
    assert index.invalidate([B], tenant="t") == 1
    assert index.find("t", "m", b, lambda chain: len(chain)) is None  # blocks "still held"
    assert index.find("t", "m", a, held_by(cache)) is not None


def test_the_donor_holding_most_of_a_chunk_is_chosen_and_a_restored_prompt_replaces_itself(
) -> None:
    cache, index = make_cache(), DonorIndex(BLOCK_SIZE, per_chunk=2)
    b = chunk(2, 2 * BLOCK_SIZE + 5)
    first, spans1 = prompt_of((A, chunk(1)), (B, b))
    second, spans2 = prompt_of((C, chunk(3, BLOCK_SIZE + 3)), (B, b))
    stored(cache, index, first, spans1)
    stored(cache, index, second, spans2)
    stored(cache, index, second, spans2)  # the same prompt again: still one donor for it
    assert len(index) == 4  # A, C, and B twice (one per donor prompt)
    best = index.find("t", "m", b, held_by(cache))
    assert best is not None and best.held == len(b)
    with pytest.raises(ValueError):
        DonorIndex(0)


def test_content_hash_is_of_token_ids() -> None:
    assert chunk_content_hash([1, 2, 3]) == chunk_content_hash([1, 2, 3])
    assert chunk_content_hash([1, 2, 3]) != chunk_content_hash([1, 2, 4])
    assert chunk_content_hash([1, 2]) != chunk_content_hash([1, 2, 0])


def test_a_prompt_s_cached_head_donates_and_the_whole_prompt_replaces_it() -> None:
    cache, index = make_cache(), DonorIndex(BLOCK_SIZE, per_chunk=2)
    b = chunk(2)
    prompt, spans = prompt_of((A, chunk(1)), (B, b))
    hashes = block_hashes(prompt, tenant="t", model="m")
    head = spans[1].start // BLOCK_SIZE + 1  # a warm prefix ending inside b
    cache.admit(tenant="t", hashes=hashes[:head], nbytes=64 * head)
    index.donate("t", "m", prompt, spans, hashes[:head])
    partial = index.find("t", "m", b, held_by(cache))
    assert partial is not None and partial.held == head * BLOCK_SIZE - spans[1].start
    stored(cache, index, prompt, spans)
    index.donate("t", "m", prompt, spans, hashes[:head])  # a later hit on the head: no news
    assert len(index) == 2  # one record per chunk of the one prompt
    whole = index.find("t", "m", b, held_by(cache))
    assert whole is not None and whole.held == len(b)


def test_past_max_chunks_the_contents_donated_longest_ago_are_forgotten() -> None:
    cache, index = make_cache(), DonorIndex(BLOCK_SIZE, max_chunks=2)
    a, b, c = chunk(1), chunk(2), chunk(3)
    stored(cache, index, *prompt_of((A, a), (B, b)))
    stored(cache, index, *prompt_of((C, c)))
    assert len(index) == 2
    assert index.find("t", "m", a, held_by(cache)) is None  # held, but forgotten
    assert index.find("t", "m", b, held_by(cache)) is not None
    assert index.invalidate([A]) == 0 and index.invalidate([C]) == 1
