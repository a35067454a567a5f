"""Request caching per block (vLLM's prefix caching): the `PrefixCache` whose request entries
evict and are touched one block at a time, and the name -> class map a worker picks by.

Why: a RAG prompt's head (system prompt, first chunk) is shared by many prompts and its tail
(later chunks, the question) by few. Cached per entry, a prompt's head leaves with its tail,
or a hit on the head keeps the whole tail alive. Per block, as vLLM's free queue does, the
head outlives the tail: the fair bench (docs/lab/2026-12-03-fair-bench.md) found that this
alone put `reactive` ahead of every per-entry policy on the Poetry and Helm traces.

How, over the entry model: a request's prompt is stored as one request entry per leading run
of its blocks (blocks are shared, so the runs cost no bytes beyond the prompt's own). An
eviction then frees one block at a time, the prompt's last first; a hit touches every run
along the match, its shortest last, so the head is the most recent. Warm entries (pinned or
with a TTL) keep their own semantics: a warmup stores one entry, and no runs are added under
a pinned entry's blocks (they could not go); under an evictable warm entry's (a TTL'd or
expired one, `history`'s fill) they are, so a request's head outlives that entry too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from workers.kv.block_pool import ChunkKey
from workers.kv.cache import PrefixCache
from workers.kv.entries import CacheEntry, Kind, WarmupRefused

__all__ = [
    "DEFAULT_REQUEST_CACHING", "REQUEST_CACHING", "BlockRequestCache", "make_prefix_cache",
]


class BlockRequestCache(PrefixCache):
    """A `PrefixCache` whose request caching evicts and touches per block (module doc)."""

    def lookup(
        self, hashes: Sequence[str], *, now: float | None = None
    ) -> tuple[CacheEntry | None, int]:
        """As `PrefixCache.lookup`, and a hit touches every entry along the match: the one
        returned first, then each that ends within the match, longest to shortest."""
        t = self._now(now)
        self.expire(t)
        entry, matched = self._match(hashes)
        if entry is not None and self.touching:
            self._touch(entry, t)
            for k in range(matched, 0, -1):
                run = self._entries.get(hashes[k - 1])
                if run is not None and run is not entry:
                    self._touch(run, t)
        return entry, matched

    def admit(
        self,
        *,
        tenant: str,
        hashes: Sequence[str],
        nbytes: int,
        chunk_refs: Iterable[ChunkKey] = (),
        ttl_s: float | None = None,
        pin: bool = False,
        command_id: str | None = None,
        kind: Kind = "managed",
        chunk_starts: Mapping[ChunkKey, int] | None = None,
        approx_from: int | None = None,
        transient: bool = False,
    ) -> tuple[CacheEntry, list[CacheEntry]]:
        """As `PrefixCache.admit`; a request's prompt also stores each shorter leading run
        of its blocks as a request entry, longest first, so that the eviction order (by
        storing order until a hit) takes the prompt's last block first. Returns the
        prompt's entry and every entry evicted for it and its runs."""
        entry, evicted = super().admit(
            tenant=tenant, hashes=hashes, nbytes=nbytes, chunk_refs=chunk_refs, ttl_s=ttl_s,
            pin=pin, command_id=command_id, kind=kind, chunk_starts=chunk_starts,
            approx_from=approx_from, transient=transient,
        )
        if kind == "request" and not entry.managed and not transient:
            evicted += self._store_runs(entry, command_id)
        return entry, evicted

    def _store_runs(self, entry: CacheEntry, command_id: str | None) -> list[CacheEntry]:
        evicted: list[CacheEntry] = []
        chain = entry.block_hashes
        for k in range(len(chain) - 1, 0, -1):
            last = chain[k - 1]
            if last in self._entries or last not in self.pool:
                continue  # a run already stored, or the prompt's entry lost it to eviction
            if self.pool[last].pins:
                break  # a pinned entry holds this run and every shorter one: none could go
            starts = {r: s for r, s in entry.chunk_starts.items() if s < k * self.block_size}
            sizes = [self.pool[h].nbytes for h in chain[:k]]
            try:
                _, gone = super().admit(
                    tenant=entry.tenant, hashes=chain[:k], nbytes=sum(sizes), chunk_refs=starts,
                    command_id=command_id, kind="request", chunk_starts=starts,
                )
            except WarmupRefused:
                break  # only the entry count can refuse (the blocks are held): keep the rest
            evicted += gone
        return evicted

    def _touch(self, entry: CacheEntry, t: float) -> None:
        entry.last_used = t
        entry.hits += 1
        self._policy.touch(entry.prefix_hash)


# How a worker's request caching evicts (`RAGWARM_WORKER_REQUEST_CACHING`).
DEFAULT_REQUEST_CACHING: Literal["block", "entry"] = "entry"
REQUEST_CACHING: dict[str, type[PrefixCache]] = {"entry": PrefixCache, "block": BlockRequestCache}


def make_prefix_cache(request_caching: str, *args: Any, **kwargs: Any) -> PrefixCache:
    """The cache whose request caching is `request_caching` ("block" or "entry"); the
    error lists the valid names. Other arguments go to `PrefixCache`."""
    try:
        cls = REQUEST_CACHING[request_caching]
    except KeyError:
        valid = ", ".join(sorted(REQUEST_CACHING))
        raise ValueError(
            f"unknown request caching {request_caching!r}; valid names: {valid}"
        ) from None
    return cls(*args, **kwargs)
