"""Whether a hot prefix pays for its pin: request caching alone would lose it between asks.

Pure bookkeeping over the query stream. A pinned prefix holds bytes that request caching
would otherwise give to whatever is asked next; it earns them back only on an ask request
caching would have missed. Under LRU an ask misses exactly when its *reuse distance* (the
bytes of the other distinct prefixes asked since this prefix's previous ask) exceeds what
request caching holds (Mattson's stack distance). A prefix asked again within that distance
is kept by request caching alone (the worker's SLRU keeps re-asked prompts even longer), so
pinning it freezes bytes for nothing; a prefix whose re-asks come from beyond it is the one
a pin saves. The hot set pins only the latter.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

# Distinct prefixes remembered; an ask older than that counts as a first ask. Also bounds the
# walk that measures a distance (in practice it stops at the capacity, far sooner).
MAX_TRACKED = 4096


@dataclass
class ReuseStack:
    """Distinct prefixes of the query stream, most recent last, with their sizes."""

    max_tracked: int = MAX_TRACKED
    _stack: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def ask(self, key: str, size: int, cap: float = float("inf")) -> float | None:
        """Record an ask of `key`; its reuse distance (sizes summed), at most just past `cap`
        (the walk stops there), or None for a first ask (or one older than the stack)."""
        distance: float | None = None
        if key in self._stack:
            distance = 0
            for other in reversed(self._stack):
                if other == key or distance > cap:
                    break
                distance += self._stack[other]
            self._stack.move_to_end(key)
        self._stack[key] = size
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

    def forget_before(self, cutoff: float) -> None:
        for key in [k for k, t in self._beyond.items() if t < cutoff]:
            del self._beyond[key]
