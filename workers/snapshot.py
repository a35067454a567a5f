"""What a worker reports of its cache: the snapshot behind its events, heartbeats and
`/v1/cache`, rebuilt by the runtime after every change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    """The cache as of the last change: what events, heartbeats and `/v1/cache` report."""

    mem_used: int
    mem_total: int
    pinned_bytes: int
    entries: tuple[dict[str, Any], ...]
    # The block pool's figures (`workers.kv.block_pool.PoolStats`): shared, managed, request...
    blocks: dict[str, int] = field(default_factory=dict)
    # The disk tier's chain ends and bytes (empty without one).
    tier_prefixes: tuple[str, ...] = ()
    tier_bytes: int = 0
    tier_total: int = 0  # what the tier may hold

    @property
    def prefixes(self) -> list[str]:
        return [e["prefix_hash"] for e in self.entries]


EMPTY = Snapshot(0, 0, 0, ())
# Tier chain ends one status event lists at most (the latest stored): with 65,536 warm
# prefixes beside them the record stays under the codec's 4 MB bound.
MAX_TIER_PREFIXES = 16_384


def entry_summary(entry: Any, now: float) -> dict[str, Any]:
    expires = None if entry.expires_at is None else round(entry.expires_at - now, 3)
    return {
        "prefix_hash": entry.prefix_hash,
        "tenant": entry.tenant,
        "tokens": entry.n_tokens,
        "bytes": entry.nbytes,
        "pinned": entry.pinned,
        "kind": entry.kind,
        "blocks": entry.n_blocks,
        "hits": entry.hits,
        "expires_in_s": expires,
        "chunk_refs": [{"chunk_id": c, "content_hash": h} for c, h in sorted(entry.chunk_refs)],
    }
