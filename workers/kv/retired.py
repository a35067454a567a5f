"""Chunk versions a worker invalidated lately, so a request computed from one is not cached.

A RAG request retrieves its chunks, then waits for the engine; an invalidation of one of
those chunk versions can run on the worker in between. Request caching would then store
the prompt's KV after the invalidation that should have removed it, and the stale entry
would outlive every command sent for the edit (`bench faults` counted it as a lost
invalidation under load). So a request's admission naming a version retired in the last
`hold_s` is refused: its answer was computed as asked, only its caching is skipped.

Warm prefixes are the streams app's decisions, made from its current docs table: their
admission is never refused here, and it lifts the mark (an edit reverted to an earlier
text makes that chunk version current again). The marks expire after `hold_s`, longer than
any request waits for the engine, and at most `max_marks` are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from workers.kv.block_pool import ChunkKey
from workers.kv.entries import WarmupRefused

HOLD_S = 300.0
MAX_MARKS = 65_536


class Retired:
    """Invalidated chunk versions by (tenant, chunk), each with when it was retired."""

    def __init__(self, hold_s: float = HOLD_S, max_marks: int = MAX_MARKS) -> None:
        self.hold_s, self.max_marks = hold_s, max_marks
        self._marks: OrderedDict[tuple[str | None, ChunkKey], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._marks)

    def retire(self, tenant: str | None, refs: Iterable[ChunkKey], now: float) -> None:
        """Mark `refs` invalidated at `now`, of `tenant` (None: of every tenant)."""
        for ref in refs:
            key = (tenant, ref)
            self._marks.pop(key, None)
            self._marks[key] = now
        while len(self._marks) > self.max_marks:
            self._marks.popitem(last=False)

    def admitting(self, tenant: str, refs: Iterable[ChunkKey], request: bool,
                  now: float) -> None:
        """Check an admission naming `refs`: a request's that names a version retired less
        than `hold_s` ago raises `WarmupRefused`; a warm prefix's lifts the marks it names."""
        self._expire(now)
        for ref in refs:
            keys = ((tenant, ref), (None, ref))
            if not request:
                for key in keys:
                    self._marks.pop(key, None)
            elif any(key in self._marks for key in keys):
                raise WarmupRefused(f"chunk {ref[0]}@{ref[1][:12]} was invalidated while the "
                                    "request waited; its KV is not cached")

    def _expire(self, now: float) -> None:
        while self._marks:
            key, at = next(iter(self._marks.items()))
            if at > now - self.hold_s:
                return
            del self._marks[key]
