"""The prefixes asked lately, and which of them an edit re-checks (pure).

An edit can change the top-3 of a question whose prefix uses none of the edited
document's chunks (a new chunk now ranks above one it used), and the `doc_prefixes` links
lead only to the prefixes that use the document. So the app keeps, per process, the asks
of the last `edit_hold_s` (as long as an edit holds what it warms): per prefix, its newest
question, chunks, size and ask times, and an edit retrieves the most asked of them again.
It is process-local like the hot tracker's windows before they are flushed, not a table:
the tracked prefixes live in the `prefixes` table, keyed by prefix hash, which the
partition handling a KB change cannot read; losing the log (a restart, a moved partition)
only makes the next edits re-check less until the asks come back. Bounded by `capacity`
prefixes, the least recently asked going first, and by `MAX_TIMES` ask times a prefix
(older ones dropped as each ask comes in): a prefix asked a million times between two
edits kept a million floats (32 MB) until the next edit pruned them.

It also counts every prefix's asks however long ago (`seen`, same bound): an edit brings
back dependents asked more than once before the hot window (`often_asked`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from schemas import ChunkRef

# Ask times kept per prefix: the ranking of re-checks (most asked first) then sees at most
# this many, which still orders the many prefixes asked a few times that it is for.
MAX_TIMES = 64


def _times() -> deque[float]:
    return deque(maxlen=MAX_TIMES)


@dataclass
class Asked:
    """One prefix's recent asks: enough to rank it and to retrieve its question again."""

    tenant: str
    question: str
    chunk_refs: tuple[ChunkRef, ...]
    tokens: int
    times: deque[float] = field(default_factory=_times)

    @property
    def last(self) -> float:
        return self.times[-1] if self.times else float("-inf")


@dataclass
class Seen:
    """One prefix's asks since this process first saw it: how many, the last, its size."""

    tokens: int
    count: int = 0
    last: float = float("-inf")


@dataclass
class AskLog:
    """Asks per prefix hash within `window_s` of the newest clock reading, and how often
    each was asked at all (`seen`)."""

    window_s: float
    capacity: int = 4096
    entries: dict[str, Asked] = field(default_factory=dict)
    seen: dict[str, Seen] = field(default_factory=dict)

    def observe(self, prefix_hash: str, tenant: str, question: str,
                chunk_refs: Sequence[ChunkRef], tokens: int, now: float) -> None:
        entry = self.entries.pop(prefix_hash, None)  # re-inserted: the dict is LRU-ordered
        if entry is None:
            entry = Asked(tenant, question, tuple(chunk_refs), tokens)
        entry.question = question  # the newest question re-checks it best
        entry.times.append(now)
        while entry.times[0] < now - self.window_s:
            entry.times.popleft()
        self.entries[prefix_hash] = entry
        while len(self.entries) > self.capacity:
            del self.entries[next(iter(self.entries))]
        seen = self.seen.pop(prefix_hash, None) or Seen(tokens)
        seen.tokens, seen.count, seen.last = tokens, seen.count + 1, now
        self.seen[prefix_hash] = seen  # LRU-ordered like `entries`
        while len(self.seen) > self.capacity:
            del self.seen[next(iter(self.seen))]

    def recent(self, now: float) -> dict[str, Asked]:
        """The prefixes asked within the window ending at `now` (older asks dropped)."""
        horizon = now - self.window_s
        for prefix_hash in list(self.entries):
            entry = self.entries[prefix_hash]
            while entry.times and entry.times[0] < horizon:
                entry.times.popleft()
            if not entry.times:
                del self.entries[prefix_hash]
        return dict(self.entries)


def recheck_order(recent: dict[str, Asked], skip: Collection[str],
                  limit: int) -> list[tuple[str, Asked]]:
    """The asked prefixes an edit re-retrieves although they use none of its document's
    chunks (its new chunks may now rank in their questions' top-3): most asked, then most
    recently asked, at most `limit` (each is one retrieval)."""
    ranked = sorted(((h, a) for h, a in recent.items() if h not in skip),
                    key=lambda ha: (-len(ha[1].times), -ha[1].last, ha[0]))
    return ranked[:limit]


def often_asked(seen: dict[str, Seen], dependents: Collection[str],
                skip: Collection[str]) -> list[tuple[str, Seen]]:
    """The dependents (not in `skip`) asked more than once, whenever: most asked first, then
    most recently asked. Once is not enough: an edit that held prefixes asked once long ago
    filled the pinned share with KV nobody asked for again."""
    found = [(h, seen[h]) for h in dependents if h in seen and h not in skip
             and seen[h].count > 1]
    return sorted(found, key=lambda hs: (-hs[1].count, -hs[1].last, hs[0]))


def entered(new_refs: Sequence[ChunkRef], doc_chunks: Collection[str]) -> bool:
    """Whether a re-retrieved top-3 holds a chunk of the edited document: the edit changed
    it (any other change would have been re-checked by that document's own edit)."""
    return any(r.chunk_id in doc_chunks for r in new_refs)
