"""Chunk KV for the torch engine: held chunks blended into a prompt after its exact prefix
(`workers.engines.blend`). A chunk's KV is the stored prefix `opening + chunk`
(`workers.kv.chunk_kv`), which the exact lookup already reuses where the chunk comes first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from workers.engines.base import Request
from workers.engines.blend import (
    KV,
    BlendResult,
    Piece,
    Selection,
    blend,
    prefill,
    require_llama_like,
)
from workers.engines.kv_blocks import BlockKV, join
from workers.kv.cache import ChunkKey
from workers.kv.chunk_kv import PiecePlan, chunk_prefix, held_chunk_tokens, plan_pieces


class BlockHolder(Protocol):
    """What chunk blending needs of the engine that holds the block tensors."""

    model: Any
    model_id: str
    block_size: int

    def block_hashes(self, token_ids: Sequence[int], *, tenant: str) -> list[str]: ...

    def held_run(self, hashes: list[str], *, hit: bool) -> list[BlockKV]:
        """The leading blocks of `hashes` whose tensors are held (`hit`: count a use)."""
        ...


class ChunkBlender:
    """Blends held chunk KV (stored by `Engine.prefill_chunk`) into prompts.

    `selection` None means chunk reuse is off: prompts are never blended (chunk KV can
    still be computed and stored, so turning it on finds it warm).
    """

    def __init__(self, engine: BlockHolder, selection: Selection | None) -> None:
        self._engine = engine
        self.selection = selection
        if selection is not None:
            require_llama_like(engine.model)  # refused at start, not on the first request

    def blend(
        self, request: Request, exact: list[BlockKV], cached: int
    ) -> tuple[BlendResult, int] | None:
        """The prompt blended from its exact prefix (blocks `exact`, `cached` tokens) and the
        held KV of the chunks after it; None when off, opted out, or nothing is held."""
        spans = request.chunks
        if self.selection is None or not request.chunk_reuse or not spans:
            return None
        opening = request.prompt[: spans[0].start]
        chains = self._held_chains(request, opening, cached)
        n_exact = max(cached, len(opening))
        size = self._engine.block_size
        held = {ref: held_chunk_tokens(len(opening), len(chain), size)
                for ref, chain in chains.items()}
        plans = plan_pieces(spans, n_exact, held)
        if not plans:
            return None
        exact_kv = _cut(join(exact), 0, cached) if cached else None
        exact_kv, _ = self._opening_kv(opening, request.tenant, (exact_kv, cached))
        pieces = [self._piece(plan, chains[plan.span.ref], len(opening)) for plan in plans]
        result = blend(self._engine.model, request.prompt, exact_kv, pieces, self.selection)
        return result, sum(plan.count for plan in plans)

    def _held_chains(
        self, request: Request, opening: list[int], cached: int
    ) -> dict[ChunkKey, list[BlockKV]]:
        """Per chunk not covered by the exact prefix, the leading blocks of its KV held here
        (a lookup: holding them for a prompt is a hit, and refreshes them for the policy)."""
        e, chains = self._engine, {}
        for span in request.chunks:
            if span.end <= cached:
                continue
            tokens = chunk_prefix(opening, request.prompt[span.start : span.end])
            hashes = e.block_hashes(tokens, tenant=request.tenant)
            # Peek first: the opening's blocks alone are held for every prompt, and holding
            # only them is no use of this chunk's KV.
            n = len(e.held_run(hashes, hit=False))
            if held_chunk_tokens(len(opening), n, e.block_size) > 0:
                chains[span.ref] = e.held_run(hashes[:n], hit=True)
        return chains

    def _piece(self, plan: PiecePlan, blocks: list[BlockKV], n_opening: int) -> Piece:
        """The planned part of a chunk's KV, cut out of its `opening + chunk` blocks."""
        at = n_opening + plan.offset  # where the part starts in those blocks
        first = at // self._engine.block_size
        skip = at - first * self._engine.block_size
        kv = _cut(join(blocks[first:]), skip, skip + plan.count)
        return Piece(start=plan.start, kv=kv, computed_at=at)

    def _opening_kv(
        self, opening: list[int], tenant: str, cached: tuple[KV | None, int]
    ) -> tuple[KV | None, int]:
        """KV of at least the whole opening: `cached` (KV of its first n tokens, or more)
        extended by computing the rest; and how many tokens that computed."""
        kv, n = cached
        if n >= len(opening):
            return kv, 0
        rest, _ = prefill(self._engine.model, opening[n:], kv)
        if kv is None:
            return rest, len(opening) - n
        with torch.inference_mode():
            joined = tuple(
                (torch.cat((k, rk), dim=-2), torch.cat((v, rv), dim=-2))
                for (k, v), (rk, rv) in zip(kv, rest, strict=True)
            )
        return joined, len(opening) - n


def _cut(kv: KV, start: int, stop: int) -> KV:
    return tuple((k[..., start:stop, :], v[..., start:stop, :]) for k, v in kv)
