"""Thin Faust agents: decode, look state up, call `streams.logic`, send what it returns."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import faust
from pydantic import ValidationError

from schemas import (
    ChunkRef,
    DeadLetter,
    KbChange,
    QueryEvent,
    SchemaError,
    WorkerEvent,
    decode,
    encode,
)
from streams import logic
from streams.hot import HotPayload, HotTracker
from streams.ports import RagPort, WarmPrefix
from streams.records import DocLink, DocState, PrefixOp, PrefixState, WorkerState
from streams.settings import StreamsSettings
from streams.tables import Tables
from streams.topics import Topics

log = logging.getLogger(__name__)


@dataclass
class Pipeline:
    """Everything the agents share: topics, tables, the RAG port and counters."""

    app: faust.App
    topics: Topics
    tables: Tables
    rag: RagPort
    settings: StreamsSettings
    tracker: HotTracker
    stats: Counter = field(default_factory=Counter)
    # Qdrant local mode and the embedder are not safe to share across threads: one thread
    # runs every store call, off the event loop.
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="ragwarm-store")
    )

    async def blocking(self, fn: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def live_workers(self) -> list[WorkerState]:
        horizon = time.time() - self.settings.worker_stale_s
        rows = [WorkerState.model_validate(v) for v in self.tables.workers.values() if v]
        return [
            w if w.last_seen >= horizon else w.model_copy(update={"ready": False}) for w in rows
        ]

    async def dead_letter(self, event: faust.EventT, reason: str, field_name: str | None) -> None:
        msg = event.message
        letter = DeadLetter(
            source_topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            key_b64=base64.b64encode(msg.key).decode() if msg.key else None,
            value_b64=base64.b64encode(msg.value or b"").decode(),
            reason=reason[:4096],
            error_field=field_name,
        )
        await self.topics.deadletter.send(key=msg.key, value=encode(letter))
        self.stats["dead_letters"] += 1
        log.warning("dead letter from %s[%s]@%s: %s", msg.topic, msg.partition, msg.offset, reason)

    async def send_op(self, op: PrefixOp) -> None:
        await self.topics.prefix_ops.send(
            key=op.prefix_hash.encode(), value=op.model_dump_json().encode()
        )

    async def apply_plan(self, plan: logic.PrefixPlan, op: PrefixOp) -> None:
        for cmd in plan.commands:
            await self.topics.commands.send(key=(cmd.prefix_hash or "").encode(), value=encode(cmd))
        if plan.state is None:
            self.tables.prefixes.pop(op.prefix_hash, None)
        else:
            self.tables.prefixes[op.prefix_hash] = plan.state.model_dump(mode="json")
        for link in plan.links:
            await self.topics.doc_links.send(
                key=link.doc_id.encode(), value=link.model_dump_json().encode()
            )
        self.stats.update(plan.counters)
        if op.reason.startswith("re-prefill") and plan.counters.get("prefills"):
            self.stats["re_prefills"] += 1
        for question in plan.rewarm_questions[: self.settings.rewarm_questions]:
            prefix = await self.blocking(self.rag.prefix_for_question, question, op.tenant)
            if prefix is not None:
                await self.send_op(warm_op(prefix, op.tenant, question, op, pin=plan.rewarm_pin))


def warm_op(
    prefix: WarmPrefix,
    tenant: str,
    question: str | None,
    cause: PrefixOp | None = None,
    *,
    pin: bool = False,
) -> PrefixOp:
    """A `warm` op for `prefix`; `cause` is the op whose decision led here, if any."""
    return PrefixOp(
        op="warm",
        prefix_hash=prefix.prefix_hash,
        tenant=tenant,
        chunk_refs=prefix.chunk_refs,
        token_ids=prefix.token_ids,
        question=question,
        pin=pin,
        reason=f"re-prefill after {cause.reason}" if cause else "hot",
        origin_ts=cause.origin_ts if cause else None,
    )


async def guarded(p: Pipeline, event: faust.EventT, handle: Callable[[], Awaitable[None]]) -> None:
    """Run one record's handler; a failure dead-letters the record instead of the agent."""
    try:
        await handle()
    except SchemaError as exc:
        await p.dead_letter(event, str(exc), exc.field)
    except ValidationError as exc:
        err = exc.errors()[0]
        await p.dead_letter(
            event, f"invalid record: {err['msg']}", ".".join(map(str, err["loc"])) or None
        )
    except Exception as exc:  # noqa: BLE001 - one bad record must not stop the agent
        log.exception("processing failed")
        await p.dead_letter(event, f"processing failed: {type(exc).__name__}: {exc}", None)


def register_agents(p: Pipeline) -> None:
    app, topics = p.app, p.topics

    @app.agent(topics.kb_changes, name="ragwarm.kb-changes")
    async def kb_changes(stream):
        async for event in stream.events():
            await guarded(p, event, lambda e=event: on_kb_change(p, decode(e.value, KbChange)))

    @app.agent(topics.prefix_ops, name="ragwarm.prefix-ops")
    async def prefix_ops(stream):
        async for event in stream.events():
            await guarded(
                p, event, lambda e=event: on_prefix_op(p, PrefixOp.model_validate_json(e.value))
            )

    @app.agent(topics.doc_links, name="ragwarm.doc-links")
    async def doc_links(stream):
        async for event in stream.events():
            await guarded(
                p, event, lambda e=event: on_doc_link(p, DocLink.model_validate_json(e.value))
            )

    @app.agent(topics.worker_events, name="ragwarm.worker-events")
    async def worker_events(stream):
        async for event in stream.events():
            await guarded(
                p, event, lambda e=event: on_worker_event(p, decode(e.value, WorkerEvent))
            )

    @app.agent(topics.queries, name="ragwarm.token-frequency")
    async def queries(stream):
        async for event in stream.events():
            await guarded(p, event, lambda e=event: on_query(p, decode(e.value, QueryEvent)))

    @app.timer(p.settings.hot_tick_s, name="ragwarm.hot-tick")
    async def hot_tick():
        await plan_hot(p)

    if p.settings.warm_cron:

        @app.crontab(p.settings.warm_cron, name="ragwarm.scheduled-warmup")
        async def scheduled_warmup():
            log.info("scheduled warmup of %d hot prefixes", len(p.tracker.hot))
            for op in list(p.tracker.hot.values()):
                await p.send_op(op.model_copy(update={"reason": "scheduled"}))


async def on_kb_change(p: Pipeline, change: KbChange) -> None:
    prior_raw = p.tables.docs.get(change.doc_id)
    prior = DocState.model_validate(prior_raw) if prior_raw else None
    if logic.is_stale(change, prior):
        p.stats["stale_events"] += 1
        return
    new_chunks = await p.blocking(p.rag.index, change)
    if new_chunks is None:  # the store holds a newer version than our table (a replay)
        p.stats["stale_events"] += 1
        return
    links = p.tables.doc_prefixes.get(change.doc_id) or {}
    dependents = {h: [ChunkRef.model_validate(r) for r in refs] for h, refs in links.items()}
    plan = logic.plan_kb_change(change, prior, new_chunks, dependents, time.time())
    p.tables.docs[change.doc_id] = plan.state.model_dump(mode="json")
    p.stats["kb_events"] += 1
    for op in plan.ops:
        await p.send_op(op)


async def on_prefix_op(p: Pipeline, op: PrefixOp) -> None:
    if op.op in ("warm", "warm_on") and not await p.blocking(p.rag.refs_current, op.chunk_refs):
        # Freshness: never prefill KV from chunk text that is no longer current.
        p.stats["stale_warm_skipped"] += 1
        return
    if op.op == "invalidate":
        p.tracker.forget(op.prefix_hash)
    raw = p.tables.prefixes.get(op.prefix_hash)
    state = PrefixState.model_validate(raw) if raw else None
    plan = logic.plan_prefix_op(op, state, p.live_workers(), time.time(), p.settings.prefix_ttl_s)
    await p.apply_plan(plan, op)


async def on_doc_link(p: Pipeline, link: DocLink) -> None:
    current = p.tables.docs.get(link.doc_id)
    doc = DocState.model_validate(current) if current else None
    links, stale = logic.plan_doc_link(p.tables.doc_prefixes.get(link.doc_id) or {}, link, doc)
    p.tables.doc_prefixes[link.doc_id] = links
    if stale is not None:
        await p.send_op(stale)


async def on_worker_event(p: Pipeline, event: WorkerEvent) -> None:
    raw = p.tables.workers.get(event.worker_id)
    prior = WorkerState.model_validate(raw) if raw else None
    state = logic.apply_worker_event(prior, event, time.time())
    p.tables.workers[event.worker_id] = state.model_dump(mode="json")
    if event.kind == "stored" and event.prefix_tokens:
        p.stats["kv_bytes_per_token"] = event.bytes // event.prefix_tokens
    if event.kind == "ready":
        for op in list(p.tracker.hot.values()):
            await p.send_op(
                op.model_copy(update={"op": "warm_on", "target_worker": event.worker_id})
            )


async def on_query(p: Pipeline, query: QueryEvent) -> None:
    payload = HotPayload(
        tenant=query.tenant,
        question=query.question,
        chunk_refs=tuple(query.chunk_refs),
        prefix_tokens=query.prefix_tokens,
    )
    p.tracker.observe(query.prefix_hash, payload, time.time())
    p.stats["queries"] += 1


async def plan_hot(p: Pipeline) -> None:
    """Warm the hottest prefixes that fit the hot-token share; release those that cooled."""
    ranked = p.tracker.ranked(time.time())
    ready = [w for w in p.live_workers() if w.ready]
    budget = int(p.settings.hot_share * sum(w.mem_total for w in ready))
    per_token = p.stats.get("kv_bytes_per_token") or p.settings.kv_bytes_per_token
    candidates = [logic.HotCandidate(h, c, pl.prefix_tokens) for h, c, pl in ranked]
    hot, cooled = logic.plan_hot_set(
        candidates, budget, per_token, p.tracker.hot, p.settings.hot_min_count
    )
    payloads = {h: pl for h, _, pl in ranked}
    for prefix_hash in hot:
        if prefix_hash not in p.tracker.hot:
            op = await hot_warm_op(p, prefix_hash, payloads[prefix_hash])
            if op is not None:
                p.tracker.hot[prefix_hash] = op
                await p.send_op(op)
    for prefix_hash in cooled:
        op = p.tracker.hot.pop(prefix_hash)
        await p.send_op(
            PrefixOp(op="cool", prefix_hash=op.prefix_hash, tenant=op.tenant, reason="cooled down")
        )


async def hot_warm_op(p: Pipeline, prefix_hash: str, payload: HotPayload) -> PrefixOp | None:
    prefix = await p.blocking(p.rag.prefix_for_refs, list(payload.chunk_refs), payload.tenant)
    if prefix is None or prefix.prefix_hash != prefix_hash:
        # The query's chunks changed since it was asked: warm what it would retrieve now.
        prefix = await p.blocking(p.rag.prefix_for_question, payload.question, payload.tenant)
    if prefix is None:
        return None
    return warm_op(prefix, payload.tenant, payload.question, pin=True)
