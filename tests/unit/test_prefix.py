"""The prefix contract: a prompt's prefix id is the hash of the prefix's last full block."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.prefix import PromptParams, block_hashes, prefix_chain, prompt_chain

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
