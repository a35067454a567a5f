"""Event-driven chunk warmup decisions (pure): on a KB change, which chunk KV to compute and
which to drop, so the next first-asked question over the document finds its chunks warm.

A chunk's KV is the prefix `system + chunk` on the worker, so a question never asked before
reuses it exactly when the chunk opens its top-3 (the canonical order puts it first). Which
chunks will do that is not known; what is known is which chunks questions retrieve: those
retrieved by more distinct questions of the hot window (then by more asks) are the likeliest
to be retrieved by the next new one. Chunks nobody retrieved are not warmed. Outside edits,
neither are chunks only one prompt retrieved: that prompt's own prefix (which warmup keeps
for tracked questions) saves as much compute per byte of KV and more per ask, so chunk KV
pays only where it is shared (`SHARED`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from schemas import ChunkRef, KbChange, WarmupCommand
from streams.decide.records import DocState

# Distinct prompts that must retrieve a chunk before its own KV is worth memory: with one,
# the prompt's prefix is the better use of the same bytes (see the module's docstring).
SHARED = 2


def changed_chunks(prior: DocState | None, new_chunks: Mapping[str, str]) -> tuple[
    list[ChunkRef], list[ChunkRef]
]:
    """(new refs: chunks added or edited, old refs: the versions they replace or deleted)."""
    before = prior.chunks if prior is not None else {}
    new = [ChunkRef(chunk_id=c, content_hash=h) for c, h in _in_order(new_chunks)
           if before.get(c) != h]
    old = [ChunkRef(chunk_id=c, content_hash=h) for c, h in _in_order(before)
           if new_chunks.get(c) != h]
    return new, old


def _in_order(chunks: Mapping[str, str]) -> list[tuple[str, str]]:
    """By ordinal (`doc_id#ordinal`): doc#2 before doc#10."""
    def ordinal(item: tuple[str, str]) -> tuple[int, str]:
        tail = item[0].rpartition("#")[2]
        return (int(tail) if tail.isdigit() else -1, item[0])

    return sorted(chunks.items(), key=ordinal)


def plan_chunk_warmup(
    change: KbChange,
    prior: DocState | None,
    new_chunks: Mapping[str, str],
    *,
    tracked: bool,
    opening_ids: Sequence[int],
    chunk_tokens: Mapping[str, Sequence[int]],
    ttl_s: float,
    budget: int,
    command_ids: Sequence[str],
    token_budget: int | None = None,
    pin: bool = False,
    retrieved: Mapping[str, Retrieval] | None = None,
) -> list[WarmupCommand]:
    """Chunk prefills for the new chunks of a hot or tracked document, and one invalidation
    of the chunk versions it replaced (their KV can never be reused: its hash is gone).

    `tracked`: the document is hot or linked to a tracked prefix (others are not warmed:
    nobody is known to ask about them). `retrieved`: how questions retrieved the
    document's chunks before the change (`retrieval_counts`); the new chunks are taken in
    `rank_new_chunks`' order up to `budget` prefills (the warm budget) and `token_budget`
    chunk tokens of KV (None: no limit). `pin`: held until `ttl_s` runs out (KV nobody has
    used yet is otherwise the LRU's first victim). `command_ids`: fresh ids, one per
    command. A stale change (older version) plans nothing.
    """
    if change.is_stale(prior.version if prior else None):
        return []
    new, old = changed_chunks(prior, new_chunks)
    ids = iter(command_ids)
    commands = []
    if old:
        commands.append(WarmupCommand(
            command_id=next(ids), op="invalidate", tenant=change.tenant, chunk_refs=old,
            reason=f"{change.doc_id} v{change.version}: replaced chunk KV",
        ))
    if not tracked or not opening_ids:
        return commands
    ranked = rank_new_chunks(new, retrieved or {})
    chosen = within_budget([r for r in ranked if chunk_tokens.get(r.chunk_id)], chunk_tokens,
                           budget, token_budget)
    for ref in chosen:
        commands.append(chunk_prefill(
            next(ids), change.tenant, ref, chunk_tokens[ref.chunk_id], opening_ids, ttl_s,
            f"{change.doc_id} v{change.version}: new chunk {ref.chunk_id}", pin=pin,
        ))
    return commands


def within_budget(
    refs: Sequence[ChunkRef], chunk_tokens: Mapping[str, Sequence[int]], most: int,
    token_budget: int | None,
) -> list[ChunkRef]:
    """The leading refs that fit: at most `most`, and their tokens within `token_budget`."""
    chosen, used = [], 0
    for ref in refs[: max(0, most)]:
        used += len(chunk_tokens[ref.chunk_id])
        if token_budget is not None and used > token_budget:
            break
        chosen.append(ref)
    return chosen


def chunk_prefill(
    command_id: str, tenant: str, ref: ChunkRef, tokens: Sequence[int],
    opening_ids: Sequence[int], ttl_s: float, reason: str, worker_id: str | None = None,
    pin: bool = False,
) -> WarmupCommand:
    """One `prefill_chunk` command (to every worker unless `worker_id` names one)."""
    return WarmupCommand(
        command_id=command_id, op="prefill_chunk", tenant=tenant, worker_id=worker_id,
        token_ids=list(tokens), opening_ids=list(opening_ids), chunk_refs=[ref], ttl_s=ttl_s,
        pin=pin, reason=reason,
    )


def doc_of(chunk_id: str) -> str:
    """The document of a chunk id (`doc_id#ordinal`)."""
    return chunk_id.rpartition("#")[0] or chunk_id


def hot_docs(hot_refs: Iterable[Sequence[ChunkRef]]) -> set[str]:
    """Documents whose chunks stand in a prefix of the hot set."""
    return {doc_of(ref.chunk_id) for refs in hot_refs for ref in refs}


def plan_ready_chunks(
    hot_refs: Iterable[Sequence[ChunkRef]],
    chunk_tokens: Mapping[str, Sequence[int]],
    *,
    tenant: str,
    worker_id: str,
    opening_ids: Sequence[int],
    ttl_s: float,
    token_budget: int,
    command_ids: Sequence[str],
    pin: bool = False,
) -> list[WarmupCommand]:
    """A worker that became ready gets the KV of these chunks (each once, in the order
    given: `rank_window_chunks`' likeliest first) within `token_budget` tokens: a first-asked
    question opening with one then finds it warm there too."""
    if not opening_ids:
        return []
    unique: dict[tuple[str, str], ChunkRef] = {}
    for refs in hot_refs:
        for ref in refs:
            if chunk_tokens.get(ref.chunk_id):
                unique.setdefault((ref.chunk_id, ref.content_hash), ref)
    refs_in_order = list(unique.values())
    chosen = within_budget(refs_in_order, chunk_tokens, len(refs_in_order), token_budget)
    ids = iter(command_ids)
    return [
        chunk_prefill(next(ids), tenant, ref, chunk_tokens[ref.chunk_id], opening_ids, ttl_s,
                      f"worker {worker_id} ready: hot chunk {ref.chunk_id}", worker_id, pin)
        for ref in chosen
    ]


def asked_in_window(retrieved: Mapping[str, Retrieval], doc_id: str, min_count: float) -> bool:
    """Whether the document counts as hot by its retrievals: some chunk of it retrieved by
    prompts asked at least `min_count` times together (the hot set's own threshold).

    The hot set alone is not enough to tell: an edit's invalidation drops the document's
    hot prefix (`HotTracker.forget`) until the next hot tick re-retrieves it, and a second
    edit landing in between would find the document neither hot nor linked."""
    return any(doc_of(chunk_id) == doc_id and r.asks >= min_count
               for chunk_id, r in retrieved.items())


@dataclass(frozen=True)
class Retrieval:
    """How a chunk id was retrieved: by how many distinct prompts, asked how often."""

    prompts: int = 0
    asks: float = 0.0


def retrieval_counts(asked: Iterable[tuple[Sequence[ChunkRef], float]]) -> dict[str, Retrieval]:
    """Per chunk id, the prompts (each: its chunk refs and how often it was asked) that
    retrieved it. By id, whatever the version: an edit's new version inherits the old one's
    retrievals (the same questions retrieve the same passage)."""
    counts: dict[str, Retrieval] = {}
    for refs, asks in asked:
        for chunk_id in {r.chunk_id for r in refs}:
            was = counts.get(chunk_id, Retrieval())
            counts[chunk_id] = Retrieval(was.prompts + 1, was.asks + asks)
    return counts


def rank_new_chunks(new: Sequence[ChunkRef], retrieved: Mapping[str, Retrieval]) -> list[
    ChunkRef
]:
    """The new chunks of a change worth warming, likeliest to be retrieved first.

    First the new versions of chunks questions retrieved, by distinct prompts then asks (a
    new question is another question: how many different ones retrieved a chunk says more
    than how often one was repeated); then new chunks next to a retrieved one in their
    document (an edit moves text across chunk boundaries, so a retrieved passage may now
    sit in its neighbour), by that neighbour's retrieval. Chunks nobody is known to
    retrieve are left out. Ties keep document order. One retrieving prompt is enough here
    (unlike `SHARED`): the edit invalidated that prompt's prefix, and the edit's re-warm
    share may leave it cold, so the new chunk's KV is what is left to restore of it.
    """
    def by_id(chunk_id: str) -> tuple[int, float]:
        r = retrieved.get(chunk_id)
        return (r.prompts, r.asks) if r else (0, 0.0)

    def own(ref: ChunkRef) -> tuple[int, float]:
        return by_id(ref.chunk_id)

    def near(ref: ChunkRef) -> tuple[int, float]:
        return max((by_id(n) for n in _neighbours(ref.chunk_id)), default=(0, 0.0))

    direct = sorted((r for r in new if own(r) > (0, 0.0)), key=own, reverse=True)
    beside = sorted((r for r in new if own(r) == (0, 0.0) and near(r) > (0, 0.0)),
                    key=near, reverse=True)
    return [*direct, *beside]


def rank_window_chunks(
    asked: Sequence[tuple[Sequence[ChunkRef], float]], warm_openers: Iterable[ChunkRef] = ()
) -> list[ChunkRef]:
    """The chunk versions at least `SHARED` of the window's prompts retrieved, likeliest to
    be retrieved by a new question first (distinct prompts, then asks; ties in first-seen
    order), without those already warm at the start of a kept prefix (`warm_openers`: a
    hot prefix holds `system + its first chunk`)."""
    counts = retrieval_counts(asked)
    skip = {(r.chunk_id, r.content_hash) for r in warm_openers}
    seen: dict[tuple[str, str], ChunkRef] = {}
    for refs, _ in asked:
        for r in refs:
            key = (r.chunk_id, r.content_hash)
            if key not in skip and counts[r.chunk_id].prompts >= SHARED:
                seen.setdefault(key, r)
    score = {key: (counts[key[0]].prompts, counts[key[0]].asks) for key in seen}
    return [seen[k] for k in sorted(seen, key=score.__getitem__, reverse=True)]


@dataclass
class WarmedChunks:
    """Chunk versions this process sent to every worker, and when: a timer re-plans often,
    and a chunk prefill sent within its TTL is not sent again."""

    sent: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def due(self, tenant: str, refs: Iterable[ChunkRef], now: float, ttl_s: float) -> list[
        ChunkRef
    ]:
        def is_due(ref: ChunkRef) -> bool:
            at = self.sent.get((tenant, ref.chunk_id, ref.content_hash))
            return at is None or now - at >= ttl_s

        return [r for r in refs if is_due(r)]

    def mark(self, tenant: str, refs: Iterable[ChunkRef], now: float, ttl_s: float) -> None:
        for r in refs:
            self.sent[(tenant, r.chunk_id, r.content_hash)] = now
        # Bounded: entries past their TTL would be due again anyway.
        for key in [k for k, at in self.sent.items() if now - at >= ttl_s]:
            del self.sent[key]


def _neighbours(chunk_id: str) -> list[str]:
    """The ids of the chunks before and after it in its document (`doc#ordinal`)."""
    doc, _, tail = chunk_id.rpartition("#")
    if not doc or not tail.isdigit():
        return []
    n = int(tail)
    return [f"{doc}#{m}" for m in (n - 1, n + 1) if m >= 0]
