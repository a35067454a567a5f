"""Per-query rows of a strategies run and the freshness check behind their `stale` flag."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schemas import ChunkRef

Span = tuple[ChunkRef, int, int]  # a chunk's ref and its [start, end) in the prompt tokens


@dataclass(frozen=True)
class QueryRow:
    """One query as one policy served it; every TTFT reported comes from these rows."""

    policy: str
    index: int
    at: float
    qid: str
    burst: bool
    post_edit: bool  # first ask of the question since an edit to a document it depends on
    repeat: bool  # the question was asked before in this run (its first ask is a cold miss)
    ttft_ms: float  # measured (or estimated) compute, plus `queued_ms`
    prompt_tokens: int
    prefix_tokens: int
    cached_tokens: int
    hit: bool  # the whole block-aligned prefix came from the cache
    partial: bool  # some but not all of it did
    stale: bool  # reused KV covers a whole chunk whose content hash is no longer current
    outdated_partial: bool  # reused the unchanged leading tokens of an outdated chunk version
    mem_share: float
    pinned_share: float
    disk_share: float | None = None  # disk tier bytes / device KV budget; None: no tier
    restored: bool = False  # some of its cached tokens were read back from the disk tier
    since_restart: int | None = None  # its policy's queries since the restart; None: before
    blended_tokens: int = 0  # prompt tokens placed from held chunk KV (chunk reuse)
    approx_cached_tokens: int = 0  # of `cached_tokens`, those an earlier blend stored
    queued_ms: float = 0.0  # of `ttft_ms`, the wait behind the worker's warmup prefills
    # Chunk tokens past the exact prefix, and those of them stored prompts held on arrival.
    chunk_tokens: int = 0
    chunk_tokens_held: int = 0
    # Rows whose KV a blend made (this one's or a stored one's): whether the first token
    # is the exact computation's; None otherwise.
    first_token_agrees: bool | None = None
    # The prefix asked (block-chain hash): a miss traces to the app's ops on it (run.json's
    # commands, the streams counters) and to the same question's earlier asks.
    prefix_hash: str | None = None

    @property
    def approximate(self) -> bool:
        """Some of its KV came from a blend (placed now, or stored by an earlier answer)."""
        return bool(self.blended_tokens or self.approx_cached_tokens)


def reuse_check(
    entry_refs: frozenset[tuple[str, str]],
    spans: Sequence[Span],
    cached: int,
    current: Callable[[list[str]], dict[str, str]],
) -> tuple[bool, bool]:
    """(stale, outdated_partial) of a served query, against the store's current hashes.

    A chunk whose whole block was reused must match the store (else: stale). A chunk whose
    leading tokens only were reused may come from an older version (same tokens, same KV).
    """
    full = {ref.chunk_id for ref, _, end in spans if end <= cached}
    part = {ref.chunk_id for ref, start, end in spans if start < cached < end}
    used = [(c, h) for c, h in entry_refs if c in full | part]
    if not used:
        return False, False
    now = current([c for c, _ in used])
    old = {c for c, h in used if now.get(c) != h}
    return bool(old & full), bool(old & part)
