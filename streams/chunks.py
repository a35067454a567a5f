"""Event-driven chunk warmup decisions (pure): on a KB change, which chunk KV to compute and
which to drop, so the next first-asked question over the document finds its chunks warm."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from schemas import ChunkRef, KbChange, WarmupCommand
from streams.records import DocState


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
) -> list[WarmupCommand]:
    """Chunk prefills for the new chunks of a hot or tracked document, and one invalidation
    of the chunk versions it replaced (their KV can never be reused: its hash is gone).

    `tracked`: the document is hot or linked to a tracked prefix (others are not warmed:
    nobody is known to ask about them). `budget`: most chunk prefills sent for one change
    (the warm budget), taken in document order: a deterministic choice, nothing here knows
    which chunk will rank. `token_budget`: most chunk tokens of KV those prefills compute
    (None: no limit). `pin`: held until `ttl_s` runs out (KV nobody has used yet is
    otherwise the LRU's first victim). `command_ids`: fresh ids, one per command.
    A stale change (older version) plans nothing.
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
    chosen = within_budget([r for r in new if chunk_tokens.get(r.chunk_id)], chunk_tokens,
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
    """A worker that became ready gets the chunk KV of the hot set's chunks (each once, in
    the hot set's order, most used first) within `token_budget` tokens: a first-asked
    question over the hot documents then finds its chunks warm there too."""
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
