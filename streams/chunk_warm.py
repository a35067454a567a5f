"""Event-driven chunk warmup, the handlers' side: look up what `streams.chunks` decides
with, send its commands, count them. Off unless `RAGWARM_STREAMS_CHUNK_WARMUP` is on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from schemas import ChunkRef, KbChange, WarmupCommand
from streams import chunks, logic
from streams.hot import HotTracker
from streams.ports import RagPort
from streams.records import DocState, WorkerState
from streams.settings import StreamsSettings


class HandlerDeps(Protocol):
    """What these functions use of `streams.handlers.HandlerDeps` (which calls them, so it
    cannot be imported here)."""

    out: Any
    rag: RagPort
    settings: StreamsSettings
    tracker: HotTracker
    clock: Callable[[], float]
    stats: Counter

    async def blocking(self, fn: Callable, *args: Any) -> Any: ...

    def live_workers(self) -> list[WorkerState]: ...


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
    tracked = linked or change.doc_id in hot
    new, _ = chunks.changed_chunks(prior, new_chunks)
    tokens: dict[str, list[int]] = {}
    opening: list[int] = []
    if tracked and new:
        tokens = await p.blocking(p.rag.chunk_tokens, new, change.tenant)
        opening = await p.blocking(p.rag.opening_ids)
    commands = chunks.plan_chunk_warmup(
        change, prior, new_chunks, tracked=tracked, opening_ids=opening, chunk_tokens=tokens,
        ttl_s=p.settings.chunk_ttl_s, budget=p.settings.chunk_warm_max,
        token_budget=chunk_tokens_budget(p), command_ids=_ids(len(new) + 1),
        pin=p.settings.chunk_pin,
    )
    await _send(p, commands)
    if tracked:
        # New chunks it could have warmed that the budget left cold.
        sent = sum(c.op == "prefill_chunk" for c in commands)
        p.stats["chunk_warm_over_budget"] += sum(r.chunk_id in tokens for r in new) - sent


async def warm_ready(p: HandlerDeps, worker_id: str) -> None:
    """A worker that became ready gets the KV of the hot set's chunks (on top of its
    prefixes), so first asks over hot documents blend there too."""
    if not p.settings.chunk_warmup:
        return
    by_tenant: dict[str, list[list[ChunkRef]]] = {}
    for op in p.tracker.hot.values():
        by_tenant.setdefault(op.tenant, []).append(op.chunk_refs)
    opening = await p.blocking(p.rag.opening_ids) if by_tenant else []
    for tenant, hot_refs in by_tenant.items():
        refs = [r for refs in hot_refs for r in refs]
        tokens = await p.blocking(p.rag.chunk_tokens, refs, tenant)
        await _send(p, chunks.plan_ready_chunks(
            hot_refs, tokens, tenant=tenant, worker_id=worker_id, opening_ids=opening,
            ttl_s=p.settings.chunk_ttl_s, token_budget=chunk_tokens_budget(p),
            command_ids=_ids(len(refs)), pin=p.settings.chunk_pin,
        ))


def chunk_tokens_budget(p: HandlerDeps) -> int:
    """Tokens of chunk KV one change (or one ready worker) may warm: `chunk_warm_share` of
    the smallest ready worker's KV memory (every worker gets the same chunks)."""
    per_token = p.stats.get("kv_bytes_per_token") or p.settings.kv_bytes_per_token
    ready = [w.mem_total for w in p.live_workers() if w.ready]
    return int(p.settings.chunk_warm_share * min(ready, default=0)) // max(1, per_token)


async def _send(p: HandlerDeps, commands: list[WarmupCommand]) -> None:
    for cmd in commands:
        await p.out.command(logic.with_expiry(cmd, p.clock(), p.settings.command_expiry_s))
        p.stats["chunk_prefills" if cmd.op == "prefill_chunk" else "chunk_invalidations"] += 1


def _ids(n: int) -> list[str]:
    return [logic.command_id() for _ in range(n)]
