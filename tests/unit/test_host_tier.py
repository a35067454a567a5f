"""The host-memory KV tier: what it keeps, gives back, drops for room and for staleness."""

from __future__ import annotations

import torch

from workers.engines.disk_tier import decode_header, encode_header
from workers.engines.host_tier import HostTier
from workers.engines.kv_tier import Layout
from workers.kv.tier_index import TierBlock
from workers.kv.tier_journal import TierOps

LAYOUT = Layout("float16", (2, 1, 16, 4))
A, B, C = "aa" * 16, "bb" * 16, "cc" * 16
REF = ("doc#1", "h1")


def block(h: str, parent: str | None = None, marks: frozenset = frozenset()) -> TierBlock:
    return TierBlock(h, parent, "t", LAYOUT.nbytes, marks)


def data(value: float) -> torch.Tensor:
    return torch.full(LAYOUT.shape, value, dtype=torch.float16)


def test_a_spilled_chain_reads_back_the_same_tensors() -> None:
    tier = HostTier(10 * LAYOUT.nbytes, LAYOUT, "cpu")
    tier.put(block(A), data(1.0))
    tier.put(block(B, A), data(2.0))
    assert tier.scan() == 0  # nothing outlives the process
    back = tier.load([A, B, C])  # C was never spilled: the run stops before it
    assert [float(t[0, 0, 0, 0]) for t in back] == [1.0, 2.0]
    assert tier.index.run([A, B, C], 0) == 2


def test_the_budget_evicts_the_least_recently_used_leaf() -> None:
    tier = HostTier(2 * LAYOUT.nbytes, LAYOUT, "cpu")
    tier.put(block(A), data(1.0))
    tier.put(block(B), data(2.0))
    tier.load([A])  # A used last: B goes for C
    tier.put(block(C), data(3.0))
    assert A in tier.index and C in tier.index and B not in tier.index
    assert tier.load([B]) == [] and tier.index.bytes_used == 2 * LAYOUT.nbytes


def test_an_invalidated_chunk_leaves_the_tier_with_what_extends_it() -> None:
    tier = HostTier(10 * LAYOUT.nbytes, LAYOUT, "cpu")
    tier.put(block(A), data(1.0))
    tier.put(block(B, A, frozenset({REF})), data(2.0))
    tier.put(block(C, B), data(3.0))
    removed = tier.apply(TierOps(refs={("t", REF)}), {})
    assert sorted(removed) == sorted([B, C])
    assert len(tier.load([A, B])) == 1 and B not in tier.index  # A, held before the chunk
    # (C, without marks, proves no fork from B: it may go on through REF.)


def test_a_changed_chunks_first_block_stays_where_another_chunk_forks_from_it() -> None:
    # B holds the first tokens of REF and of OTHER (a document's title): C goes on with REF,
    # D with OTHER. REF's change takes C only; B's KV is D's prompt's too.
    other, d = ("doc#2", "h2"), "dd" * 16
    tier = HostTier(10 * LAYOUT.nbytes, LAYOUT, "cpu")
    tier.put(block(A), data(1.0))
    tier.put(block(B, A, frozenset({REF})), data(2.0))
    tier.put(block(C, B, frozenset({REF})), data(3.0))
    tier.put(block(d, B, frozenset({other})), data(4.0))
    assert tier.apply(TierOps(refs={("t", REF)}), {}) == [C]
    assert tier.index.run([A, B, d]) == 3


def test_a_block_of_another_layout_is_not_given_back() -> None:
    tier = HostTier(10 * LAYOUT.nbytes, LAYOUT, "cpu")
    tier.put(block(A), torch.zeros(LAYOUT.shape, dtype=torch.float32))  # not the layout's
    assert tier.load([A]) == [] and A not in tier.index


def test_a_disk_blocks_header_keeps_a_blends_mark() -> None:
    blend = TierBlock(A, None, "t", LAYOUT.nbytes, frozenset({REF}), end=True, approx=True)
    assert decode_header(encode_header(blend, LAYOUT), LAYOUT, LAYOUT.nbytes) == blend
    exact = TierBlock(B, A, "t", LAYOUT.nbytes)
    assert decode_header(encode_header(exact, LAYOUT), LAYOUT, LAYOUT.nbytes) == exact
