"""The engine warmup a worker runs before it reports ready: one throwaway request."""

from __future__ import annotations

import time
from itertools import cycle, islice

from workers.engines.protocol import Engine, GenerateRequest
from workers.kv.budgets import BOOT_DECODE_TOKENS

# Ordinary prose: the kernels, the allocator and the attention see a realistic prompt.
BOOT_TEXT = (
    "The knowledge base answers questions about deployments, releases and their "
    "configuration; each answer cites the passages it was built from. "
)
# Salts the request's block hashes apart from every tenant's: it can never hit their KV.
BOOT_TENANT = "ragwarm-boot-warmup"


def warm_engine(engine: Engine, tokens: int) -> float:
    """Run a `tokens`-token prompt and the first decode step through the engine, caching
    nothing (seed 000: 65% of a cold start is the first decode step, 20% framework init).
    Returns the seconds it took; 0 when there is nothing to warm."""
    if tokens < 1:
        return 0.0
    prompt = list(islice(cycle(engine.tokenize(BOOT_TEXT)), tokens))
    start = time.perf_counter()
    steps = engine.generate(GenerateRequest(
        prompt, max_tokens=BOOT_DECODE_TOKENS, tenant=BOOT_TENANT, stop_ids=[],
        chunk_reuse=False,
    ))
    for _ in steps:
        pass
    return time.perf_counter() - start
