"""A model-free engine: the worker's cache bookkeeping, with TTFT from a fitted cost model.

`replay --evaluate` runs the benchmark's policies and `SimWorker` over this engine instead
of the torch one: prefills and request caching admit entries to the same `PrefixCache`,
lookups match the same block chains, and no prompt is computed. TTFT is estimated with a
linear cost model (fixed cost + cost per prompt token not served from cache) fitted by
least squares to a query log's own measured `ttft_ms`, `prompt_tokens`, `cached_tokens`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from schemas import QueryEvent
from workers.cache import PrefixCache, WarmupRefused
from workers.engines.base import GenerationResult, GenerationStep, PrefixEngine, Request

# Fallback cost model: SmolLM2-135M, torch engine, 1 thread on a shared 2-core CPU, fitted
# to the 504 rows of run B of `ragwarm bench strategies --quick` (docs/lab/benchmarks-notebook.md).
DEFAULT_COST = (127.0, 3.14)  # (ms fixed, ms per uncached prompt token)


@dataclass(frozen=True)
class CostModel:
    """TTFT ≈ fixed_ms + per_token_ms × (prompt tokens − cached tokens)."""

    fixed_ms: float
    per_token_ms: float
    fitted_on: int = 0  # measured queries behind the fit (0: the default figures)

    def ttft_ms(self, prompt_tokens: int, cached_tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * max(0, prompt_tokens - cached_tokens)


def fit_cost(events: Iterable[QueryEvent]) -> CostModel:
    """Least-squares line of measured TTFT against uncached prompt tokens; the default
    figures when the log has fewer than two distinct uncached sizes."""
    points = [(e.prompt_tokens - e.cached_tokens, e.ttft_ms) for e in events
              if e.ttft_ms is not None and e.prompt_tokens > 0]
    xs = [float(x) for x, _ in points]
    if len(set(xs)) < 2:
        return CostModel(*DEFAULT_COST)
    n, mx = len(points), sum(xs) / len(points)
    my = sum(float(y) for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (float(y) - my) for x, (_, y) in zip(xs, points, strict=True)) / sxx
    slope = max(slope, 0.0)
    return CostModel(max(my - slope * mx, 0.0), slope, n)


class CostEngine(PrefixEngine[int]):
    """An engine that holds only each entry's size and answers in estimated time."""

    # No model: no device, no vocabulary beyond the one token it answers with, no context
    # limit of its own (`Limits` bound the prompts, as for every engine).
    device = "none (cost model)"
    vocab_size = 1
    max_model_len = 1 << 30

    def __init__(self, cost: CostModel, cache: PrefixCache, *, model_id: str,
                 kv_bytes_per_token: int) -> None:
        self.cost = cost
        self.cache = cache
        self.model_id = model_id
        self.block_size = cache.block_size
        self.kv_bytes_per_token = kv_bytes_per_token
        self.tokenizer = None
        self._held: dict[str, int] = {}

    def _held_bytes(self, held: int) -> int:
        return held

    def _prefix_kv(self, tokens: list[int], hashes: list[str], tenant: str) -> tuple[int, int]:
        # Blocks are shared: whatever chain is cached is reused, whoever stored it.
        _, matched = self.cache.peek(hashes)
        return len(tokens) * self.kv_bytes_per_token, len(tokens) - matched * self.block_size

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        start = time.perf_counter()
        prompt = request.prompt
        hashes = self.block_hashes(prompt, tenant=request.tenant)
        entry, matched = self._lookup(hashes)
        cached = min(matched * self.block_size, len(prompt) - 1)
        stored = None
        keep = request.keep
        if keep is not None and hashes and matched < len(hashes):
            n_tokens = len(hashes) * self.block_size
            try:
                admitted, evicted = self.cache.admit(
                    tenant=request.tenant, hashes=hashes,
                    nbytes=n_tokens * self.kv_bytes_per_token, chunk_refs=keep.chunk_refs,
                    ttl_s=keep.ttl_s, kind="request",
                )
                stored = self._record(admitted, n_tokens * self.kv_bytes_per_token, evicted,
                                      n_tokens - cached, start)
            except WarmupRefused:
                stored = None  # the answer matters more than caching its prompt
        ttft = self.cost.ttft_ms(len(prompt), cached) / 1000.0
        result = GenerationResult(
            token_ids=(0,), text="", prompt_tokens=len(prompt), cached_tokens=cached,
            prefix_hash=entry.prefix_hash if entry else None, ttft_s=ttft, total_s=ttft,
            finish_reason="length", stored=stored,
        )
        yield GenerationStep(0, 0, "", result)
