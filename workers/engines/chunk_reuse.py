"""Chunk KV for the torch engine: the KV of chunks held in other stored prompts (donors,
`workers.kv.chunk_kv`) blended into a prompt after its exact prefix (`workers.engines.blend`),
where the cost estimate says that beats computing it (`workers.kv.blend_cost`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from workers.engines.base import Request
from workers.engines.blend import BlendResult, Piece, Selection, blend, require_llama_like
from workers.engines.kv_blocks import KV, BlockKV, join
from workers.kv.blend_cost import BlendCosts, blend_computed
from workers.kv.cache import ChunkKey
from workers.kv.chunk_kv import ChunkSpan, Donor, PiecePlan, plan_pieces


class BlockHolder(Protocol):
    """What chunk blending needs of the engine that holds the block tensors."""

    model: Any
    block_size: int

    def chunk_donors(self, tenant: str, prompt: Sequence[int], spans: Sequence[ChunkSpan],
                     cached: int) -> dict[ChunkKey, Donor]: ...

    def held_run(self, hashes: list[str], *, hit: bool) -> list[BlockKV]:
        """The leading blocks of `hashes` whose tensors are held (`hit`: count a use)."""
        ...


class ChunkBlender:
    """Blends the chunk KV other stored prompts hold into prompts, when it is cheaper.

    `selection` None means chunk reuse is off: prompts are never blended (chunks are still
    donated, so turning it on finds them warm). `costs` learns what a plain prefill and a
    blend cost on this engine; a blend estimated slower than the cold prefill is not run.
    """

    def __init__(
        self, engine: BlockHolder, selection: Selection | None, *, gate: bool = True
    ) -> None:
        self._engine = engine
        self.selection = selection
        self.gate = gate  # False: blend whatever the estimate says (tests, calibration)
        self.costs = BlendCosts()
        if selection is not None:
            require_llama_like(engine.model)  # refused at start, not on the first request

    def blend(
        self, request: Request, exact: list[BlockKV], cached: int
    ) -> tuple[BlendResult, int] | None:
        """The prompt blended from its exact prefix (blocks `exact`, `cached` tokens) and the
        donated KV of the chunks after it; None when off, opted out, nothing is held, or
        computing the prompt is estimated to be faster."""
        spans, selection = request.chunks, self.selection
        if selection is None or not request.chunk_reuse or not spans:
            return None
        donors = self._engine.chunk_donors(request.tenant, request.prompt, spans, cached)
        plans = plan_pieces(spans, cached, {ref: d.held for ref, d in donors.items()})
        moved = sum(plan.count for plan in plans)
        cold = len(request.prompt) - cached
        computed = blend_computed(cold - moved, moved, selection.share)
        if not plans or (self.gate and not self.costs.worth(cold, computed, moved)):
            return None
        start = time.perf_counter()
        pieces = [self._piece(plan, donors[plan.span.ref]) for plan in plans]
        # The opening and the question are computed in the blend's own pass (one pass, not
        # a separate prefill of an opening the exact prefix left out).
        dtype = self._engine.model.dtype  # blocks may be stored in another precision
        exact_kv = _cut(join(exact, dtype), 0, cached) if cached else None
        result = blend(self._engine.model, request.prompt, exact_kv, pieces, selection)
        self.costs.saw_blend(computed, moved, time.perf_counter() - start)
        return result, moved

    def _piece(self, plan: PiecePlan, donor: Donor) -> Piece:
        """The planned part of a chunk's KV, cut out of its donor's blocks; a hit on them (it
        refreshes them for the eviction policy)."""
        size = self._engine.block_size
        blocks = self._engine.held_run(list(donor.chain), hit=True)
        at = donor.start + plan.offset  # where the part starts in the donor's prompt
        first = at // size
        skip = at - first * size
        kv = _cut(join(blocks[first:], self._engine.model.dtype), skip, skip + plan.count)
        # Computed after the donor's own tokens, not this prompt's: always moved (repaired
        # by the recompute share), even where it stands at the same position.
        return Piece(start=plan.start, kv=kv, computed_at=at, in_context=False)


def _cut(kv: KV, start: int, stop: int) -> KV:
    return tuple((k[..., start:stop, :], v[..., start:stop, :]) for k, v in kv)
