"""Eviction policies for the prefix cache: which evictable (unpinned) entries go first."""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from typing import ClassVar


class EvictionPolicy(ABC):
    """Tracks the evictable entries by key and yields them in the order they should go.

    The cache adds an entry when it becomes evictable (stored unpinned, or released),
    touches it on every hit and discards it when it leaves or gets pinned. `order()`
    never mutates the policy, so the cache can plan a whole eviction before applying it.
    """

    name: ClassVar[str]

    @abstractmethod
    def add(self, key: str, *, nbytes: int, n_tokens: int, hits: int = 0) -> None:
        """Start tracking `key` (or re-track it with fresh sizes)."""

    @abstractmethod
    def touch(self, key: str) -> None:
        """Record a hit on `key`; unknown keys (pinned entries) are ignored."""

    @abstractmethod
    def discard(self, key: str, *, evicted: bool = False) -> None:
        """Stop tracking `key`; `evicted` says the policy itself chose it (for aging)."""

    @abstractmethod
    def order(self) -> Iterator[str]:
        """Tracked keys, first victim first; do not mutate the policy while iterating."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...


class LruPolicy(EvictionPolicy):
    """Least recently used first (the seed's KV-cache manager)."""

    name: ClassVar[str] = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str, *, nbytes: int, n_tokens: int, hits: int = 0) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: str) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def discard(self, key: str, *, evicted: bool = False) -> None:
        self._order.pop(key, None)

    def order(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order


class SlruPolicy(EvictionPolicy):
    """Segmented LRU: entries never hit since they were stored go first, least recently
    stored first; then those hit again, least recently used first. The workers' default.

    Why: a RAG app's questions follow a long-tailed popularity, and most prompts are asked
    once. Under plain LRU each of those pushes out a prompt that is asked again; here a
    prompt earns its place by a second ask (or a warmup that says it is used: `hits`).
    In the `--model-free` replays of `ragwarm bench strategies`
    (docs/lab/benchmarks-notebook.md, issue 17) it kept more: `hybrid` 389 hits of 528 over
    five workloads against 377 under LRU,
    `reactive` more on four workloads of the five. A cap on the second segment (0.8 of the
    bytes, as caches often set) lost hits there, so there is none: once every entry was hit
    again, it is plain LRU.
    """

    name: ClassVar[str] = "slru"

    def __init__(self) -> None:
        self._once: OrderedDict[str, None] = OrderedDict()
        self._again: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str, *, nbytes: int, n_tokens: int, hits: int = 0) -> None:
        self.discard(key)
        (self._again if hits > 0 else self._once)[key] = None

    def touch(self, key: str) -> None:
        if key in self._once:
            del self._once[key]
            self._again[key] = None
        elif key in self._again:
            self._again.move_to_end(key)

    def discard(self, key: str, *, evicted: bool = False) -> None:
        self._once.pop(key, None)
        self._again.pop(key, None)

    def order(self) -> Iterator[str]:
        return itertools.chain(self._once, self._again)

    def __len__(self) -> int:
        return len(self._once) + len(self._again)

    def __contains__(self, key: object) -> bool:
        return key in self._once or key in self._again


class _AgedPriorityPolicy(EvictionPolicy):
    """Lowest priority first, priority = age + frequency term, with dynamic aging.

    Aging (as in GDSF / LFU-DA): the age `L` rises to the priority of each policy-chosen
    victim, so an entry that was hot long ago cannot squat forever against newer ones.
    A lazy-deletion heap keeps touches O(log n); `order()` walks the heap as a tree.
    """

    def __init__(self) -> None:
        self._age = 0.0
        self._freq: dict[str, int] = {}
        self._weight: dict[str, float] = {}
        self._live: dict[str, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    @staticmethod
    @abstractmethod
    def _unit(nbytes: int, n_tokens: int) -> float:
        """Priority gained per hit for an entry of this size."""

    def add(self, key: str, *, nbytes: int, n_tokens: int, hits: int = 0) -> None:
        self._freq[key] = max(hits, 0) + 1
        self._weight[key] = self._unit(nbytes, n_tokens)
        self._push(key)

    def touch(self, key: str) -> None:
        if key in self._live:
            self._freq[key] += 1
            self._push(key)

    def discard(self, key: str, *, evicted: bool = False) -> None:
        live = self._live.pop(key, None)
        if live is None:
            return
        if evicted:
            self._age = max(self._age, live[0])
        del self._freq[key], self._weight[key]
        self._prune_top()

    def order(self) -> Iterator[str]:
        heap = self._heap
        if not heap:
            return
        frontier = [(heap[0], 0)]
        while frontier:
            item, i = heapq.heappop(frontier)
            if self._live.get(item[2]) == item[:2]:
                yield item[2]
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))

    def priority(self, key: str) -> float | None:
        """Current priority of `key` (lower goes first), None when untracked."""
        live = self._live.get(key)
        return None if live is None else live[0]

    def _push(self, key: str) -> None:
        item = (self._age + self._freq[key] * self._weight[key], next(self._seq), key)
        self._live[key] = item[:2]
        heapq.heappush(self._heap, item)
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()
        else:
            self._prune_top()

    def _prune_top(self) -> None:
        # Victims leave stale items at the top; dropping them keeps `order()` from
        # walking past every past victim on the next eviction.
        heap = self._heap
        while heap and self._live.get(heap[0][2]) != heap[0][:2]:
            heapq.heappop(heap)

    def _compact(self) -> None:
        self._heap = [(p, s, k) for k, (p, s) in self._live.items()]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live


class LfuAgedPolicy(_AgedPriorityPolicy):
    """Least frequently used first, with dynamic aging (LFU-DA): priority = L + hits."""

    name: ClassVar[str] = "lfu-aged"

    @staticmethod
    def _unit(nbytes: int, n_tokens: int) -> float:
        return 1.0


class GdsfPolicy(_AgedPriorityPolicy):
    """Greedy-Dual-Size-Frequency: priority = L + hits * tokens / bytes.

    The cost of a miss is the prefill of `n_tokens`; the size is `nbytes`. Big entries
    that are rarely hit go first, which keeps more hits per byte of KV memory.
    """

    name: ClassVar[str] = "gdsf"

    @staticmethod
    def _unit(nbytes: int, n_tokens: int) -> float:
        return max(n_tokens, 1) / max(nbytes, 1)


# What a worker evicts by unless `RAGWARM_WORKER_EVICTION_POLICY` says otherwise.
DEFAULT_POLICY = "slru"

POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LruPolicy, SlruPolicy, LfuAgedPolicy, GdsfPolicy)
}


def make_policy(name: str) -> EvictionPolicy:
    """Build the eviction policy called `name`; the error lists the valid names."""
    try:
        cls = POLICIES[name]
    except KeyError:
        valid = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown eviction policy {name!r}; valid names: {valid}") from None
    return cls()
