"""Whether a hot prefix pays for its pin: request caching alone would lose it between asks.

Pure bookkeeping over the query stream. A pinned prefix holds bytes that request caching
would otherwise give to whatever is asked next; it earns them back only on an ask request
caching would have missed. An LRU cache misses an ask exactly when its *reuse distance* (the
bytes of the other distinct prefixes asked since this prefix's previous ask) exceeds what it
holds (Mattson's stack distance). The workers' SLRU (`workers.kv.eviction`) evicts prompts asked
once before any asked again, so a prefix already asked twice is only pushed out by other
prefixes asked again: its distance counts those alone. A prefix re-asked within reach stays
cached without a pin, and pinning it freezes bytes for nothing; a prefix whose re-asks come
from beyond it is the one a pin saves. The hot set pins only the latter.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from streams.decide.warmsets import HotCandidate

# Distinct prefixes remembered; an ask older than that counts as a first ask. Also bounds the
# walk that measures a distance (in practice it stops at the capacity, far sooner).
MAX_TRACKED = 4096


@dataclass
class ReuseStack:
    """Distinct prefixes of the query stream, most recent last: their sizes and ask counts."""

    max_tracked: int = MAX_TRACKED
    _stack: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)

    def ask(self, key: str, size: int, cap: float = float("inf")) -> float | None:
        """Record an ask of `key`; its reuse distance under SLRU (sizes summed, at most just
        past `cap`: the walk stops there), or None for a first ask (or one older than the
        stack). A prefix asked twice already counts only others asked at least twice."""
        distance: float | None = None
        asks = 0
        if key in self._stack:
            asks = self._stack[key][1]
            distance = 0
            for other in reversed(self._stack):
                if other == key or distance > cap:
                    break
                other_size, other_asks = self._stack[other]
                if asks < 2 or other_asks >= 2:
                    distance += other_size
            self._stack.move_to_end(key)
        self._stack[key] = (size, asks + 1)
        while len(self._stack) > self.max_tracked:
            self._stack.popitem(last=False)
        return distance


@dataclass
class RentLedger:
    """When each prefix was last re-asked from beyond request caching's reach.

    Sizes are in tokens (a prefix's KV bytes are its tokens times one per-token figure).
    `capacity_tokens` is what request caching holds across the workers this process plans
    for, set at each hot plan (`_plan_hot`); while it is unknown (0: before the first plan,
    or no ready worker) every re-ask counts as a miss, so the hot set behaves as a plain
    frequency rule.
    """

    capacity_tokens: float = 0.0
    stack: ReuseStack = field(default_factory=ReuseStack)
    _beyond: dict[str, float] = field(default_factory=dict)

    def ask(self, prefix_hash: str, tokens: int, now: float) -> None:
        distance = self.stack.ask(prefix_hash, tokens, self.capacity_tokens)
        if distance is not None and (distance > self.capacity_tokens
                                     or self.capacity_tokens <= 0):
            self._beyond[prefix_hash] = now
            if len(self._beyond) > self.stack.max_tracked:
                oldest = min(self._beyond, key=self._beyond.__getitem__)
                del self._beyond[oldest]

    def pays(self, prefix_hash: str, now: float, window_s: float) -> bool:
        """Whether a pin of `prefix_hash` would have saved an ask in the last `window_s`."""
        when = self._beyond.get(prefix_hash)
        return when is not None and now - when <= window_s

    def plan(self, capacity_tokens: float, forget_before: float) -> None:
        """Set request caching's reach for the next asks; drop misses older than the window."""
        self.capacity_tokens = capacity_tokens
        for key in [k for k, t in self._beyond.items() if t < forget_before]:
            del self._beyond[key]


def paying(ledger: RentLedger, ranked: Iterable[tuple[str, float, Any]], capacity_tokens: float,
           now: float, settings: Any) -> list[HotCandidate]:
    """The hot-set candidates among `ranked` (prefix, count, payload with `prefix_tokens`):
    with `settings.hot_pin_rent`, only those a pin would have saved an ask for in the hot
    window. Also sets request caching's reach (`capacity_tokens`) until the next plan."""
    window_s = settings.hot_window_s
    ledger.plan(capacity_tokens, now - window_s)
    return [HotCandidate(h, c, payload.prefix_tokens) for h, c, payload in ranked
            if not settings.hot_pin_rent or ledger.pays(h, now, window_s)]
