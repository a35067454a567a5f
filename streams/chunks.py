"""Event-driven chunk warmup decisions (pure): on a KB change, which chunk KV to compute and
which to drop, so the next first-asked question over the document finds its chunks warm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
) -> list[WarmupCommand]:
    """Chunk prefills for the new chunks of a hot or tracked document, and one invalidation
    of the chunk versions it replaced (their KV can never be reused: its hash is gone).

    `tracked`: the document is hot or linked to a tracked prefix (others are not warmed:
    nobody is known to ask about them). `budget`: most chunk prefills sent for one change
    (the warm budget), taken in document order: a deterministic choice, nothing here knows
    which chunk will rank. `command_ids`: fresh ids, one per command.
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
    for ref in [r for r in new if chunk_tokens.get(r.chunk_id)][:budget]:
        commands.append(WarmupCommand(
            command_id=next(ids), op="prefill_chunk", tenant=change.tenant,
            token_ids=list(chunk_tokens[ref.chunk_id]), opening_ids=list(opening_ids),
            chunk_refs=[ref], ttl_s=ttl_s,
            reason=f"{change.doc_id} v{change.version}: new chunk {ref.chunk_id}",
        ))
    return commands
