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
prefixes; the least recently asked go first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from schemas import ChunkRef


@dataclass
class Asked:
    """One prefix's recent asks: enough to rank it and to retrieve its question again."""

    tenant: str
    question: str
    chunk_refs: tuple[ChunkRef, ...]
    tokens: int
    times: list[float] = field(default_factory=list)

    @property
    def last(self) -> float:
        return self.times[-1] if self.times else float("-inf")


@dataclass
class AskLog:
    """Asks per prefix hash within `window_s` of the newest clock reading."""

    window_s: float
    capacity: int = 4096
    entries: dict[str, Asked] = field(default_factory=dict)

    def observe(self, prefix_hash: str, tenant: str, question: str,
                chunk_refs: Sequence[ChunkRef], tokens: int, now: float) -> None:
        entry = self.entries.pop(prefix_hash, None)  # re-inserted: the dict is LRU-ordered
        if entry is None:
            entry = Asked(tenant, question, tuple(chunk_refs), tokens)
        entry.question = question  # the newest question re-checks it best
        entry.times.append(now)
        self.entries[prefix_hash] = entry
        while len(self.entries) > self.capacity:
            del self.entries[next(iter(self.entries))]

    def recent(self, now: float) -> dict[str, Asked]:
        """The prefixes asked within the window ending at `now` (older asks dropped)."""
        horizon = now - self.window_s
        for prefix_hash in list(self.entries):
            entry = self.entries[prefix_hash]
            entry.times = [t for t in entry.times if t >= horizon]
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


def entered(new_refs: Sequence[ChunkRef], doc_chunks: Collection[str]) -> bool:
    """Whether a re-retrieved top-3 holds a chunk of the edited document: the edit changed
    it (any other change would have been re-checked by that document's own edit)."""
    return any(r.chunk_id in doc_chunks for r in new_refs)
