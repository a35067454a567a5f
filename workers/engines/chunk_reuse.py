"""Chunk KV for the torch engine: a chunk's KV computed after the system prompt, and held
chunks blended into a prompt after its exact prefix (`workers.engines.blend`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from workers.cache import ChunkKey
from workers.chunk_kv import PiecePlan, chunk_hashes, plan_pieces
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
    """Computes chunk KV for the engine's store and blends held chunks into prompts.

    `selection` None means chunk reuse is off: prompts are never blended (chunk KV can
    still be computed and stored, so turning it on finds it warm).
    """

    def __init__(self, engine: BlockHolder, selection: Selection | None) -> None:
        self._engine = engine
        self.selection = selection
        if selection is not None:
            require_llama_like(engine.model)  # refused at start, not on the first request

    def hashes(self, opening: Sequence[int], chunk: Sequence[int], tenant: str,
               ref: ChunkKey) -> list[str]:
        e = self._engine
        return chunk_hashes(chunk, tenant=tenant, model=e.model_id, opening=opening, ref=ref,
                            block_size=e.block_size)

    def compute(self, opening: list[int], chunk: list[int], tenant: str) -> tuple[KV, int]:
        """The chunk's KV computed right after `opening` (its cached blocks reused), and
        how many tokens ran through the model."""
        exact, computed = self._opening_kv(opening, tenant, self._cached_opening(opening, tenant))
        kv, _ = prefill(self._engine.model, chunk, exact)
        return kv, computed + len(chunk)

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
        held = {ref: len(chain) * self._engine.block_size for ref, chain in chains.items()}
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
        chains = {}
        for span in request.chunks:
            if span.end <= cached:
                continue
            hashes = self.hashes(opening, request.prompt[span.start : span.end],
                                 request.tenant, span.ref)
            blocks = self._engine.held_run(hashes, hit=True)
            if blocks:
                chains[span.ref] = blocks
        return chains

    def _piece(self, plan: PiecePlan, blocks: list[BlockKV], n_opening: int) -> Piece:
        kv = _cut(join(blocks), plan.offset, plan.offset + plan.count)
        return Piece(start=plan.start, kv=kv, computed_at=n_opening + plan.offset)

    def _cached_opening(self, opening: list[int], tenant: str) -> tuple[KV | None, int]:
        e = self._engine
        blocks = e.held_run(e.block_hashes(opening, tenant=tenant), hit=False)  # not a hit
        return (join(blocks), len(blocks) * e.block_size) if blocks else (None, 0)

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
