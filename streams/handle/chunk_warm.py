"""Event-driven chunk warmup, the handlers' side: look up what `streams.decide.chunks` decides
with, send its commands, count them. Off unless `RAGWARM_STREAMS_CHUNK_WARMUP` is on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from schemas import ChunkRef, KbChange, WarmupCommand
from streams.decide import chunks, logic
from streams.decide.hot import HotTracker
from streams.decide.records import DocState, WorkerState, doc_key
from streams.handle.ports import RagPort
from streams.settings import StreamsSettings


class HandlerDeps(Protocol):
    """What these functions use of `streams.handle.handlers.HandlerDeps` (which calls them, so it
    cannot be imported here)."""

    out: Any
    rag: RagPort
    tables: Any
    chunk_warmed: chunks.WarmedChunks
    settings: StreamsSettings
    tracker: HotTracker
    clock: Callable[[], float]
    stats: Counter

    async def blocking(self, fn: Callable, *args: Any) -> Any: ...

    def live_workers(self) -> list[WorkerState]: ...

    def kv_bytes_per_token(self) -> int: ...


async def warm_changed(
    p: HandlerDeps, change: KbChange, prior: DocState | None, new_chunks: Mapping[str, str],
    linked: bool,
) -> None:
    """After `change` was indexed: drop the KV of the chunk versions it replaced and, for a
    document that is hot or linked to tracked prefixes, prefill its new chunks' KV on every
    worker within the warm budget (`chunk_tokens_budget`)."""
    if not p.settings.chunk_warmup:
        return
    hot = chunks.hot_docs(op.chunk_refs for op in p.tracker.hot.values())
    new, _ = chunks.changed_chunks(prior, new_chunks)
    retrieved = chunks.retrieval_counts(_asked(p, change.tenant, change.doc_id))
    tracked = linked or change.doc_id in hot or chunks.asked_in_window(
        retrieved, change.doc_id, p.settings.hot_min_count)
    tokens: dict[str, list[int]] = {}
    opening: list[int] = []
    wanted = chunks.rank_new_chunks(new, retrieved)
    if tracked and wanted:
        tokens = await p.blocking(p.rag.chunk_tokens, wanted, change.tenant)
        opening = await p.blocking(p.rag.opening_ids)
    commands = chunks.plan_chunk_warmup(
        change, prior, new_chunks, tracked=tracked, opening_ids=opening, chunk_tokens=tokens,
        ttl_s=p.settings.chunk_ttl_s, budget=p.settings.chunk_warm_max,
        token_budget=chunk_tokens_budget(p), command_ids=_ids(len(new) + 1),
        pin=p.settings.chunk_pin, retrieved=retrieved,
    )
    await _send(p, commands)
    _mark_sent(p, change.tenant, commands)
    if tracked:
        # New chunks questions retrieve that the budget left cold.
        sent = sum(c.op == "prefill_chunk" for c in commands)
        p.stats["chunk_warm_over_budget"] += sum(r.chunk_id in tokens for r in wanted) - sent


async def warm_window(p: HandlerDeps) -> None:
    """On the hot tick: keep warm on every worker the chunks the window's questions retrieve
    most (not already the first chunk of a hot prefix), so a new question opening with one
    reuses `system + chunk` exactly. The set is the ranking's head within the warm budget
    (a standing set, not a budget per tick); only its chunks not sent within their TTL are
    sent, so chunk KV never grows past the budget tick after tick."""
    if not p.settings.chunk_warmup:
        return
    now, ttl = p.clock(), p.settings.chunk_ttl_s
    opening, heads = await _window_heads(p)
    for tenant, head, tokens in heads:
        # Only current versions come back: an edit's new versions are `warm_changed`'s.
        standing = chunks.within_budget([r for r in head if tokens.get(r.chunk_id)], tokens,
                                        len(head), chunk_tokens_budget(p))
        due = p.chunk_warmed.due(tenant, standing, now, ttl)
        commands = [chunks.chunk_prefill(cid, tenant, ref, tokens[ref.chunk_id], opening, ttl,
                                         f"window chunk {ref.chunk_id}", pin=p.settings.chunk_pin)
                    for cid, ref in zip(_ids(len(due)), due, strict=True)]
        await _send(p, commands)
        _mark_sent(p, tenant, commands)


async def _window_heads(p: HandlerDeps) -> tuple[
    list[int], list[tuple[str, list[ChunkRef], dict[str, list[int]]]]
]:
    """(the opening's token ids, per tenant of the window: the head of its ranked chunks
    (`rank_window_chunks`, at most `chunk_warm_max`) and their token ids)."""
    openers = [op.chunk_refs[0] for op in p.tracker.hot.values() if op.chunk_refs]
    tenants = _tenants(p)
    opening = await p.blocking(p.rag.opening_ids) if tenants else []
    heads = []
    for tenant in tenants:
        head = chunks.rank_window_chunks(_asked(p, tenant), openers)[: p.settings.chunk_warm_max]
        tokens = await p.blocking(p.rag.chunk_tokens, head, tenant) if head else {}
        heads.append((tenant, head, tokens))
    return opening, heads


def _asked(p: HandlerDeps, tenant: str, doc_id: str | None = None) -> list[
    tuple[list[ChunkRef], float]
]:
    """The prompts known to retrieve chunks: the hot window's (with their asks), the hot
    set's and, for a document, the tracked prefixes linked to it (those two once each: asks
    unknown here)."""
    asked = {h: (list(pl.chunk_refs), c) for h, c, pl in p.tracker.ranked(p.clock())
             if pl.tenant == tenant}
    for h, op in p.tracker.hot.items():
        if op.tenant == tenant:
            asked.setdefault(h, (list(op.chunk_refs), 1.0))
    if doc_id is not None:
        for h, refs in p.tables.dependents(doc_key(tenant, doc_id)).items():
            asked.setdefault(h, (refs, 1.0))
    return list(asked.values())


def _tenants(p: HandlerDeps) -> list[str]:
    window = {pl.tenant for _, _, pl in p.tracker.ranked(p.clock())}
    return sorted(window | {op.tenant for op in p.tracker.hot.values()})


def _mark_sent(p: HandlerDeps, tenant: str, commands: list[WarmupCommand]) -> None:
    refs = [r for c in commands if c.op == "prefill_chunk" for r in c.chunk_refs]
    p.chunk_warmed.mark(tenant, refs, p.clock(), p.settings.chunk_ttl_s)


async def warm_ready(p: HandlerDeps, worker_id: str) -> None:
    """A worker that became ready gets the KV of the chunks the window's questions retrieve
    most (on top of its prefixes; not the first chunks of hot prefixes, which those hold),
    so a first ask opening with one reuses it there too."""
    if not p.settings.chunk_warmup:
        return
    opening, heads = await _window_heads(p)
    for tenant, head, tokens in heads:
        await _send(p, chunks.plan_ready_chunks(
            [head], tokens, tenant=tenant, worker_id=worker_id, opening_ids=opening,
            ttl_s=p.settings.chunk_ttl_s, token_budget=chunk_tokens_budget(p),
            command_ids=_ids(len(head)), pin=p.settings.chunk_pin,
        ))


def chunk_tokens_budget(p: HandlerDeps) -> int:
    """Tokens of chunk KV one change (or one ready worker) may warm: `chunk_warm_share` of
    the smallest ready worker's KV memory (every worker gets the same chunks)."""
    per_token = p.kv_bytes_per_token()
    ready = [w.mem_total for w in p.live_workers() if w.ready]
    return int(p.settings.chunk_warm_share * min(ready, default=0)) // max(1, per_token)


async def _send(p: HandlerDeps, commands: list[WarmupCommand]) -> None:
    for cmd in commands:
        await p.out.command(logic.with_expiry(cmd, p.clock(), p.settings.command_expiry_s))
        p.stats["chunk_prefills" if cmd.op == "prefill_chunk" else "chunk_invalidations"] += 1


def _ids(n: int) -> list[str]:
    return [logic.command_id() for _ in range(n)]
