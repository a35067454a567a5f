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

The pins are also judged as a whole by what the stream shows they would earn against what
they would cost (`RentLedger.earns`): over the last window, the asks of the candidates from
beyond the reach of all the memory (asks only a pin saves) against the asks of other
prefixes whose distance falls in the band the candidates' bytes would take from request
caching (hits only the pins lose). Both are counted whether or not the set is pinned, so
the rule can turn the set on again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
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
    # All the memory's reach (no pins); 0 while unknown: the hot set is then not judged.
    full_tokens: float = 0.0
    stack: ReuseStack = field(default_factory=ReuseStack)
    _beyond: dict[str, float] = field(default_factory=dict)
    # The last plan's candidates (prefix -> tokens), and when asks were saved by them or
    # lost to their bytes (`earns`).
    candidates: dict[str, int] = field(default_factory=dict)
    _saved: deque[float] = field(default_factory=deque)
    _lost: deque[float] = field(default_factory=deque)

    def ask(self, prefix_hash: str, tokens: int, now: float) -> None:
        cap = max(self.capacity_tokens, self.full_tokens)
        distance = self.stack.ask(prefix_hash, tokens, cap)
        if distance is not None and self.full_tokens > 0:
            self._judge(prefix_hash, distance, now)
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

    def _judge(self, prefix_hash: str, distance: float, now: float) -> None:
        """Count an ask a pin of the candidates saves, or one their bytes cost."""
        full = self.full_tokens
        if prefix_hash in self.candidates:
            if distance > full:
                self._saved.append(now)
            return
        band = min(sum(self.candidates.values()), full - self.capacity_tokens)
        if full - band < distance <= full:
            self._lost.append(now)

    def earns(self) -> bool:
        """Whether, over the window, the candidates saved more asks than their bytes cost;
        True while all the memory's reach is unknown."""
        return self.full_tokens <= 0 or len(self._saved) > len(self._lost)

    def plan(self, capacity_tokens: float, forget_before: float,
             full_tokens: float = 0.0) -> None:
        """Set request caching's reach for the next asks (with the hot share taken, and
        without: `full_tokens`); drop what is older than the window."""
        self.capacity_tokens, self.full_tokens = capacity_tokens, full_tokens
        for key in [k for k, t in self._beyond.items() if t < forget_before]:
            del self._beyond[key]
        for times in (self._saved, self._lost):
            while times and times[0] < forget_before:
                times.popleft()


def paying(ledger: RentLedger, ranked: Iterable[tuple[str, float, Any]], capacity_tokens: float,
           now: float, settings: Any, full_tokens: float = 0.0) -> list[HotCandidate]:
    """The hot-set candidates among `ranked` (prefix, count, payload with `prefix_tokens`):
    with `settings.hot_pin_rent`, only those a pin would have saved an ask for in the hot
    window, and none while the candidates cost more asks than they save (`earns`). Also
    sets request caching's reach (`capacity_tokens`; `full_tokens` with no hot share)."""
    window_s = settings.hot_window_s
    ledger.plan(capacity_tokens, now - window_s, full_tokens)
    if not settings.hot_pin_rent:
        return [HotCandidate(h, c, payload.prefix_tokens) for h, c, payload in ranked]
    found = [HotCandidate(h, c, payload.prefix_tokens) for h, c, payload in ranked
             if ledger.pays(h, now, window_s)]
    ledger.candidates = {c.prefix_hash: c.tokens for c in found}
    return found if ledger.earns() else []
