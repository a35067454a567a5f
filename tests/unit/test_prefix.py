"""The prefix contract: a prompt's prefix id is the hash of the prefix's last full block."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.prefix import (
    PromptParams,
    aligned_tokens,
    block_hashes,
    prefix_chain,
    prefix_kv_bytes,
    prompt_chain,
    warm_hit,
)

tokens = st.lists(st.integers(0, 2**32 - 1), max_size=80)


@given(tokens, tokens, st.integers(1, 8))
def test_the_prompt_chain_starts_with_the_prefix_chain(prefix, question, block):
    prompt = prompt_chain(prefix + question, len(prefix), tenant="t", model="m", block_size=block)
    alone = prefix_chain(prefix, tenant="t", model="m", block_size=block)
    assert prompt.prefix_hashes == alone.prefix_hashes == alone.hashes
    assert prompt.prefix_hash == alone.prefix_hash
    assert prompt.hashes == tuple(block_hashes(prefix + question, tenant="t", model="m",
                                               block_size=block))


@given(tokens, st.integers(1, 8))
def test_the_prefix_hash_is_its_last_full_block(prefix, block):
    chain = prefix_chain(prefix, tenant="t", model="m", block_size=block)
    assert len(chain.hashes) == len(prefix) // block
    assert chain.prefix_hash == (chain.hashes[-1] if chain.hashes else None)


def test_a_prefix_length_outside_the_prompt_is_refused():
    with pytest.raises(ValueError, match="prefix_len"):
        prompt_chain([1, 2, 3], 4, tenant="t", model="m")


def test_prompt_params_name_the_parameters_that_differ():
    ours = PromptParams.of(system_prompt="s", top_k=3, model="m", block_size=16)
    theirs = PromptParams.of(system_prompt="t", top_k=2, model="m", block_size=16)
    assert ours.differences(theirs) == ["top_k", "system_prompt_sha256"]
    assert ours.differences(ours) == [] and ours.digest() != theirs.digest()


def test_prefix_measures_count_full_blocks():
    assert aligned_tokens(47, 16) == 32 and aligned_tokens(15, 16) == 0
    assert prefix_kv_bytes(47, 10, 16) == 32 * 10
    assert prefix_kv_bytes(15, 10, 16) == 0


def test_a_warm_hit_covers_every_full_block_of_the_prefix():
    assert warm_hit(cached_tokens=64, prefix_tokens=70, block_size=16)
    assert not warm_hit(cached_tokens=48, prefix_tokens=70, block_size=16)
    # A prefix under one block has nothing to warm: never a hit, whatever was cached.
    assert not warm_hit(cached_tokens=0, prefix_tokens=10, block_size=16)
    assert not warm_hit(cached_tokens=16, prefix_tokens=10, block_size=16)


@given(st.integers(0, 4096), st.integers(0, 4096), st.integers(1, 64))
def test_a_warm_hit_needs_the_full_blocks_and_only_them(cached, prefix, block):
    aligned = aligned_tokens(prefix, block)
    assert aligned % block == 0 and prefix - block < aligned <= prefix
    # The whole prefix cached is a hit exactly when it has a full block; more cached tokens
    # never turn a hit into a miss.
    assert warm_hit(prefix, prefix, block) == (prefix >= block)
    if warm_hit(cached, prefix, block):
        assert warm_hit(cached + 1, prefix, block)
