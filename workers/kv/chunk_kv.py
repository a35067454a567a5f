"""Chunk KV identity and placement (pure): which held chunks a prompt can blend, and where.

A chunk's KV is computed right after the opening (the system prompt, where the canonical
prompt places a first chunk) and stored as the ordinary prefix `opening + chunk`: the same
block-chain hashes, tenant and model salt as any prompt that opens with that chunk. So the
exact prefix lookup reuses it losslessly for every question whose first chunk it is (no
blending needed), one copy serves both uses, and blocks shared with cached prompts count
once. Hashes are over token ids: a chunk whose text changed has other tokens and other
hashes and is never reused. The entry lists its chunk ref with the chunk's start, so
invalidating the ref frees its blocks (from the one holding the chunk's first token on)
with every prefix through them; the opening's own blocks stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.kv.block_pool import ChunkKey


@dataclass(frozen=True)
class ChunkSpan:
    """Where one retrieved chunk stands in a prompt: tokens [start, end)."""

    ref: ChunkKey
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"chunk span must have 0 <= start < end, not {self.start}..{self.end}")


def chunk_prefix(opening: Sequence[int], chunk: Sequence[int]) -> list[int]:
    """The tokens a chunk's KV is stored under: the prefix of a prompt opening with it."""
    return [*opening, *chunk]


def held_chunk_tokens(n_opening: int, n_blocks: int, block_size: int) -> int:
    """Tokens of a chunk whose KV `n_blocks` leading blocks of `opening + chunk` hold
    (0 when they end inside the opening: only whole blocks are stored)."""
    return max(0, n_blocks * block_size - n_opening)


def check_spans(spans: Sequence[ChunkSpan], n_prompt: int) -> None:
    """Spans must be ordered, disjoint, inside the prompt, and leave the last token out (the
    question's last token gives the logits, so it is always computed)."""
    end = 0
    for span in spans:
        if span.start < end:
            raise ValueError(f"chunk spans overlap or are out of order at token {span.start}")
        end = span.end
    if end >= n_prompt:
        raise ValueError("chunk spans must end before the prompt's last token")


@dataclass(frozen=True)
class PiecePlan:
    """One held chunk to place: `offset` tokens of its KV are skipped (the exact prefix
    covers them), the rest stands at prompt position `start`; `count` tokens are used."""

    span: ChunkSpan
    offset: int
    start: int
    count: int


def plan_pieces(
    spans: Sequence[ChunkSpan], n_exact: int, held: dict[ChunkKey, int]
) -> list[PiecePlan]:
    """The held chunks' parts after the exact prefix (`held`: tokens of KV held per ref).

    A chunk's KV covers its first `held[ref]` tokens (whole blocks); tokens it does not
    cover, and chunks not held, are computed like the question.
    """
    plans = []
    for span in spans:
        have = min(held.get(span.ref, 0), span.end - span.start)
        start = max(span.start, n_exact)
        offset = start - span.start
        if have > offset:
            plans.append(PiecePlan(span, offset, start, have - offset))
    return plans
