"""Chunk KV identity and placement (pure): which held chunks a prompt can blend, and where.

A chunk's KV is computed on its own, right after the system prompt (where the canonical
prompt places a first chunk), and stored in the block pool like a prefix: a chain of block
hashes whose root is salted by tenant, model, the system prompt's tokens and the chunk's
content hash. So a chunk whose content changed has other hashes and is never reused, and
the entry lists its chunk ref, so invalidating the ref frees it with every prefix through it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from workers.block_pool import ChunkKey
from workers.blocks import block_hashes


@dataclass(frozen=True)
class ChunkSpan:
    """Where one retrieved chunk stands in a prompt: tokens [start, end)."""

    ref: ChunkKey
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"chunk span must have 0 <= start < end, not {self.start}..{self.end}")


def chunk_salt(model: str, opening: Sequence[int], ref: ChunkKey) -> str:
    """The `model` salt of a chunk's chain: the model, what it was computed after, its content.

    The chunk id stays out on purpose: two chunks with the same text and content hash have
    the same KV. The opening goes in as a digest of its token ids (it is part of the KV).
    """
    digest = hashlib.sha256(json.dumps(list(opening)).encode()).hexdigest()[:32]
    return json.dumps(["ragwarm-chunk-v1", model, digest, ref[1]])


def chunk_hashes(
    tokens: Sequence[int], *, tenant: str, model: str, opening: Sequence[int], ref: ChunkKey,
    block_size: int,
) -> list[str]:
    """Block hashes of a chunk's KV (full blocks only; a trailing partial block is not kept)."""
    salt = chunk_salt(model, opening, ref)
    return block_hashes(tokens, tenant=tenant, model=salt, block_size=block_size)


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
