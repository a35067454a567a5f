"""Bounded heavy-hitter counting of prompt prefixes over hopping windows (pure)."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpaceSaving:
    """Metwally et al.'s Space-Saving: at most `capacity` counters, error <= total/capacity.

    When full, a new key replaces the smallest counter and inherits its count, so a key
    that is truly frequent is never lost; a replaced key's payload is dropped with it.
    """

    capacity: int
    counts: dict[Hashable, float] = field(default_factory=dict)
    payloads: dict[Hashable, Any] = field(default_factory=dict)

    def add(self, key: Hashable, weight: float = 1.0, payload: Any = None) -> None:
        if key in self.counts:
            self.counts[key] += weight
        elif len(self.counts) < self.capacity:
            self.counts[key] = weight
        else:
            victim = min(self.counts, key=self.counts.__getitem__)
            self.counts[key] = self.counts.pop(victim) + weight
            self.payloads.pop(victim, None)
        if payload is not None:
            self.payloads[key] = payload


@dataclass
class HoppingHeavyHitters:
    """Counts over hopping windows of `window_s` advancing by `step_s`.

    One Space-Saving sketch per step; the window ending at `now` is the sum of the last
    `window_s / step_s` steps, which is exactly the hopping window that contains `now`.
    Memory is bounded by `capacity * steps` counters whatever the traffic.
    """

    window_s: float = 600.0
    step_s: float = 60.0
    capacity: int = 256
    buckets: dict[int, SpaceSaving] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.window_s / self.step_s))

    def observe(self, key: Hashable, now: float, weight: float = 1.0, payload: Any = None) -> None:
        slot = int(now // self.step_s)
        bucket = self.buckets.get(slot)
        if bucket is None:
            bucket = self.buckets[slot] = SpaceSaving(self.capacity)
            self._expire(slot)
        bucket.add(key, weight, payload)

    def top(self, now: float, k: int | None = None) -> list[tuple[Hashable, float, Any]]:
        """Keys of the window ending at `now`, hottest first, with count and newest payload."""
        current = int(now // self.step_s)
        counts: dict[Hashable, float] = {}
        payloads: dict[Hashable, Any] = {}
        for slot in sorted(self.buckets):
            if current - self.steps < slot <= current:
                bucket = self.buckets[slot]
                for key, count in bucket.counts.items():
                    counts[key] = counts.get(key, 0.0) + count
                payloads.update(bucket.payloads)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
        return [(key, count, payloads.get(key)) for key, count in ranked[:k]]

    def _expire(self, current: int) -> None:
        for slot in [s for s in self.buckets if s <= current - self.steps]:
            del self.buckets[slot]

    def size(self) -> int:
        return sum(len(b.counts) for b in self.buckets.values())


@dataclass(frozen=True)
class HotPayload:
    """What the newest query of a prefix said about it: enough to rebuild and warm it."""

    tenant: str
    question: str
    chunk_refs: tuple[Any, ...]
    prefix_tokens: int


@dataclass
class HotTracker:
    """Prefix and question frequencies of `rag.queries`, and the set currently kept hot."""

    window_s: float = 600.0
    step_s: float = 60.0
    capacity: int = 256
    prefixes: HoppingHeavyHitters = field(init=False)
    questions: HoppingHeavyHitters = field(init=False)
    hot: dict[str, Any] = field(default_factory=dict)  # prefix hash -> its warm op

    def __post_init__(self) -> None:
        self.prefixes = HoppingHeavyHitters(self.window_s, self.step_s, self.capacity)
        self.questions = HoppingHeavyHitters(self.window_s, self.step_s, self.capacity)

    def observe(self, prefix_hash: str | None, payload: HotPayload, now: float) -> None:
        self.questions.observe((payload.tenant, payload.question), now)
        if prefix_hash:
            self.prefixes.observe(prefix_hash, now, payload=payload)

    def ranked(self, now: float) -> list[tuple[str, float, HotPayload]]:
        return [(str(k), c, p) for k, c, p in self.prefixes.top(now) if p is not None]

    def forget(self, prefix_hash: str) -> None:
        """Drop hot entries that would warm `prefix_hash` (it was invalidated)."""
        for key in [k for k, op in self.hot.items() if op.prefix_hash == prefix_hash]:
            del self.hot[key]
