"""A prefix cache on a clock the test turns, over chains of distinct 16-token blocks: what
the tests of the KV bookkeeping (`workers/kv/`) build their caches from."""

from __future__ import annotations

from workers.kv.blocks import BLOCK_SIZE, block_hashes
from workers.kv.cache import Budget, PrefixCache


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def tokens(*blocks: int) -> list[int]:
    """One 16-token block per argument, each filled with a distinct pattern."""
    return [b * 100 + i for b in blocks for i in range(BLOCK_SIZE)]


def chain(*blocks: int, tenant: str = "t1", model: str = "m") -> list[str]:
    return block_hashes(tokens(*blocks), tenant=tenant, model=model)


def make_cache(
    max_bytes: int = 1000, max_entries: int = 10, warm_bytes: int = 500, **kw: object
) -> tuple[PrefixCache, Clock]:
    clock = Clock()
    cache = PrefixCache(Budget(max_bytes, max_entries, warm_bytes), clock=clock, **kw)  # type: ignore[arg-type]
    return cache, clock
