"""Progressive warmup of a ready worker (seed 000's router: `warmup_steps 3`), as pure rules.

A worker that (re)started gets the prefixes it should hold in steps of growing size, most
used first: the first step is small, so the prefixes most in demand are warm within a few
seconds of `ready`; each later step goes once the worker has reported its memory again
(its next heartbeat), and none goes while it is above the seed's `memory_threshold`
(0.7, "stop warming above it"). One bulk re-warm instead queues every prefill at once in
front of the worker's first requests, and fills memory past the threshold before anyone
sees how full it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.events import MEMORY_THRESHOLD
from streams.decide.records import WorkerState

# Seed 000, router: "'warmup_steps': 3  # progressive warmup steps".
WARMUP_STEPS = 3


def step_shares(steps: int) -> list[float]:
    """The budget's cumulative share reached after each step: growing steps, 1:2:...:n.

    Three steps: 1/6, 3/6, 6/6 of the budget (steps of a sixth, a third, a half).
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    total = steps * (steps + 1) / 2
    return [k * (k + 1) / 2 / total for k in range(1, steps + 1)]


def wave(sizes: Sequence[tuple[str, int]], budget: int, step: int, steps: int) -> list[str]:
    """The prefixes of step `step` (1-based) among `sizes`, most used first: each goes in
    the first step whose cumulative share of `budget` covers the bytes up to its end (one
    larger than the first step's share still goes in some step: the last covers it all)."""
    if not 1 <= step <= steps:
        raise ValueError(f"step must be in 1..{steps}, got {step}")
    shares = step_shares(steps)
    chosen, used = [], 0
    for prefix_hash, size in sizes:
        used += size
        first = next((k for k, s in enumerate(shares, 1) if used <= budget * s), steps)
        if first == step:
            chosen.append(prefix_hash)
    return chosen


def next_step(worker: WorkerState, threshold: float = MEMORY_THRESHOLD) -> int | None:
    """The step to send a worker after one of its heartbeats, or None: none pending, it is
    not ready (stopped, or gone stale), or its KV use is above the threshold."""
    if not worker.warm_step or not worker.ready:
        return None
    return worker.warm_step if worker.mem_ratio <= threshold else None


def tier_room(worker: WorkerState) -> int:
    """Free bytes of the worker's KV tier below device memory (0: it keeps none)."""
    return max(0, worker.tier_total - worker.tier_bytes)
