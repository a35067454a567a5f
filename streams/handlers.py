"""What the streams app does with each record: look state up, call `streams.logic`, send.

The handlers know nothing of Faust or Kafka. They read and write the tables through plain
mappings and send through an `Outbox`: the Faust agents (`streams/agents.py`) give them
changelog tables and topics, the strategies benchmark gives them dicts and a queue on a
simulated clock, so both run this same code.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas import ChunkRef, KbChange, QueryEvent, WarmupCommand, WorkerEvent
from schemas.signing import authentic
from streams import logic
from streams.hot import HotPayload, HotTracker
from streams.ports import IndexReplica, RagPort, WarmPrefix
from streams.records import (
    DocLink,
    DocState,
    PrefixOp,
    PrefixState,
    ReadyRewarm,
    WorkerState,
    doc_key,
)
from streams.settings import StreamsSettings

Table = MutableMapping[str, Any]
log = logging.getLogger(__name__)


class Outbox(Protocol):
    """Where the handlers' output goes: the internal topics and the workers' commands."""

    async def op(self, op: PrefixOp) -> None:
        """To `ragwarm.prefix-ops`, keyed by the prefix hash."""

    async def link(self, link: DocLink) -> None:
        """To `ragwarm.doc-links`, keyed by the doc id."""

    async def command(self, cmd: WarmupCommand) -> None:
        """To `warmup.commands`, keyed by the prefix hash."""

    async def ready(self, req: ReadyRewarm) -> None:
        """To every partition of `ragwarm.worker-ready` (one request per partition)."""


@dataclass
class StreamTables:
    """The app's state; Faust changelog tables in the app, dicts in the benchmark."""

    docs: Table  # doc_key(tenant, doc_id) -> DocState
    doc_prefixes: Table  # doc_key(tenant, doc_id) -> {prefix hash: [chunk refs]}
    prefixes: Table  # prefix hash -> PrefixState
    workers: Table  # worker id -> WorkerState (read by every partition)


@dataclass
class Readiness:
    """What `/ragwarm/health/ready` reports: tables recovered and the index consistent with
    them. KB changes wait for `index` (re-indexing must not race them). Set by default:
    only the Faust app, which recovers, clears it."""

    index: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = "ready"

    def __post_init__(self) -> None:
        self.index.set()

    def wait_for_recovery(self) -> None:
        self.index.clear()
        self.reason = "recovering tables"

    def recovered(self) -> None:
        self.reason = "ready"
        self.index.set()


@dataclass
class HandlerDeps:
    """Everything the handlers share: tables, outbox, the RAG port, clock and counters."""

    tables: StreamTables
    out: Outbox
    rag: RagPort
    settings: StreamsSettings
    tracker: HotTracker
    clock: Callable[[], float] = time.time
    stats: Counter = field(default_factory=Counter)
    # Qdrant local mode and the embedder are not safe to share across threads: in the app
    # one thread runs every store call, off the event loop. None runs them inline.
    executor: Executor | None = None
    # The hot-tick timer and a worker's `ready` both re-plan the hot set; one at a time.
    hot_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    readiness: Readiness = field(default_factory=Readiness)
    # The partition of a table key among n (the producer's partitioner in the app).
    partition_of: Callable[[str, int], int] = field(default=lambda key, n: 0)
    # The index replica fed by rag.chunks (streams.replica); None: nothing to publish.
    replica: IndexReplica | None = None
    # The share of the rag.queries partitions this process owns: with N instances each
    # plans the hot set of its own tenants within that share of the hot-token budget.
    owned_share: Callable[[], float] = field(default=lambda: 1.0)

    async def blocking(self, fn: Callable, *args):
        if self.executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def live_workers(self) -> list[WorkerState]:
        horizon = self.clock() - self.settings.worker_stale_s
        rows = [WorkerState.model_validate(v) for v in self.tables.workers.values() if v]
        return [
            w if w.last_seen >= horizon else w.model_copy(update={"ready": False}) for w in rows
        ]


def warm_op(
    prefix: WarmPrefix,
    tenant: str,
    question: str | None,
    cause: PrefixOp | None = None,
    *,
    pin: bool = False,
    hold: bool = False,
    reason: str = "hot",
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
        hold=hold,
        reason=f"re-prefill after {cause.reason}" if cause else reason,
        origin_ts=cause.origin_ts if cause else None,
    )


# --- kb.changes (key tenant + doc_id) -----------------------------------------------------


async def on_kb_change(p: HandlerDeps, change: KbChange) -> None:
    if stale_in_table(p, change):
        await apply_indexed(p, change, None)
        return
    indexed = await p.blocking(p.rag.index, change)
    await publish_indexed(p)
    await apply_indexed(p, change, indexed)


async def publish_indexed(p: HandlerDeps) -> None:
    """Publish what was just indexed before anything that depends on it is sent (the ops
    it leads to may be handled by an instance whose replica must hold the new chunks)."""
    if p.replica is not None:
        await p.replica.publish()


async def refs_current(p: HandlerDeps, refs: list[ChunkRef], tenant: str) -> bool:
    """Whether the refs are current in the local index; if not, the index may be a replica
    that has not yet applied what another instance indexed: catch up and ask again."""
    if await p.blocking(p.rag.refs_current, refs, tenant):
        return True
    if p.replica is None or not await p.replica.caught_up():
        return False
    return await p.blocking(p.rag.refs_current, refs, tenant)


def stale_in_table(p: HandlerDeps, change: KbChange) -> bool:
    """Whether the docs table already holds a newer version (a replay): nothing to index."""
    prior_raw = p.tables.docs.get(doc_key(change.tenant, change.doc_id))
    return change.is_stale(DocState.model_validate(prior_raw).version if prior_raw else None)


async def apply_indexed(
    p: HandlerDeps, change: KbChange, new_chunks: dict[str, str] | None
) -> None:
    """Record an indexed change and send an op per dependent prefix; `new_chunks` is what
    indexing returned (None: older than the table, or the store holds a newer version)."""
    key = doc_key(change.tenant, change.doc_id)
    prior_raw = p.tables.docs.get(key)
    prior = DocState.model_validate(prior_raw) if prior_raw else None
    if new_chunks is None or change.is_stale(prior.version if prior else None):
        p.stats["stale_events"] += 1
        return
    links = p.tables.doc_prefixes.get(key) or {}
    dependents = {h: [ChunkRef.model_validate(r) for r in refs] for h, refs in links.items()}
    now = p.clock()
    # The hot window (this process's view of rag.queries) ranks the dependents' re-warms;
    # the hot set's are pinned already and re-warmed pinned, so they take no edit budget.
    pinned = {op.prefix_hash for op in p.tracker.hot.values()}
    recent = [
        logic.HotCandidate(h, c, pl.prefix_tokens)
        for h, c, pl in p.tracker.ranked(now) if h in dependents and h not in pinned
    ]
    plan = logic.plan_kb_change(
        change, prior, new_chunks, dependents, now, recent, edit_rewarm_tokens(p)
    )
    assert plan.state is not None  # not stale, so the plan carries the new state
    p.tables.docs[key] = plan.state.model_dump(mode="json")
    p.stats["kb_events"] += 1
    for op in plan.ops:
        await p.out.op(op)


def edit_rewarm_tokens(p: HandlerDeps) -> int:
    """Tokens of KV one KB change may re-warm into prefixes no worker holds any more."""
    per_token = p.stats.get("kv_bytes_per_token") or p.settings.kv_bytes_per_token
    memory = sum(w.mem_total for w in p.live_workers() if w.ready)
    return int(p.settings.edit_rewarm_share * memory) // max(1, per_token)


# --- ragwarm.prefix-ops (key prefix hash) ----------------------------------------------------


async def on_prefix_op(p: HandlerDeps, op: PrefixOp) -> None:
    if op.op in ("warm", "warm_on") and not await refs_current(p, op.chunk_refs, op.tenant):
        # Freshness: never prefill KV from chunk text that is no longer current.
        p.stats["stale_warm_skipped"] += 1
        return
    if op.op == "invalidate":
        p.tracker.forget(op.prefix_hash)
    raw = p.tables.prefixes.get(op.prefix_hash)
    state = PrefixState.model_validate(raw) if raw else None
    plan = logic.plan_prefix_op(op, state, p.live_workers(), p.clock(), p.settings.prefix_ttl_s)
    await apply_plan(p, plan, op)


async def apply_plan(p: HandlerDeps, plan: logic.PrefixPlan, op: PrefixOp) -> None:
    for cmd in plan.commands:
        await p.out.command(logic.with_expiry(cmd, p.clock(), p.settings.command_expiry_s))
    if plan.state is None:
        p.tables.prefixes.pop(op.prefix_hash, None)
    else:
        p.tables.prefixes[op.prefix_hash] = plan.state.model_dump(mode="json")
    for link in plan.links:
        await p.out.link(link)
    p.stats.update(plan.counters)
    if op.reason.startswith("re-prefill") and plan.counters.get("prefills"):
        p.stats["re_prefills"] += 1
    for question in plan.rewarm_questions[: p.settings.rewarm_questions]:
        prefix = await p.blocking(p.rag.prefix_for_question, question, op.tenant)
        if prefix is not None:
            await p.out.op(warm_op(prefix, op.tenant, question, op, pin=plan.rewarm_pin,
                                   hold=plan.rewarm_hold))


# --- ragwarm.doc-links (key tenant + doc_id) ----------------------------------------------


async def on_doc_link(p: HandlerDeps, link: DocLink) -> None:
    key = doc_key(link.tenant, link.doc_id)
    current = p.tables.docs.get(key)
    doc = DocState.model_validate(current) if current else None
    links, stale = logic.plan_doc_link(p.tables.doc_prefixes.get(key) or {}, link, doc)
    p.tables.doc_prefixes[key] = links
    if stale is not None:
        await p.out.op(stale)


# --- worker.events (global table) ------------------------------------------------------------


async def on_worker_event(p: HandlerDeps, event: WorkerEvent) -> None:
    secret = p.settings.worker_events_secret
    if secret is not None and not authentic(event, secret.get_secret_value().encode()):
        # A forged heartbeat would otherwise set the URL clients are routed to.
        p.stats["unauthenticated_events"] += 1
        return
    raw = p.tables.workers.get(event.worker_id)
    prior = WorkerState.model_validate(raw) if raw else None
    order = logic.epoch_order(prior, event)
    if order == "old":
        p.stats["stale_epoch_events"] += 1  # a leftover of a previous boot
        return
    if order == "new" and prior is not None:
        # Restarted (a crash leaves no `stopped`): whatever the row listed is gone.
        p.stats["worker_restarts"] += 1
        log.info("worker %s: new boot %s, its device cache starts empty (%d prefixes on its "
                 "disk tier)", event.worker_id, event.epoch, len(event.tier_prefixes))
    if event.kind == "expired":
        p.stats["expired_commands"] += 1
    state = logic.apply_worker_event(prior, event, p.clock())
    p.tables.workers[event.worker_id] = state.model_dump(mode="json")
    if event.kind == "stored" and event.prefix_tokens:
        p.stats["kv_bytes_per_token"] = event.bytes // event.prefix_tokens
    if event.kind == "ready":
        await warm_new_worker(p, event)


async def warm_new_worker(p: HandlerDeps, event: WorkerEvent) -> None:
    """A worker that (re)started holds nothing: send it the hot set, re-plan the hot set
    with its memory added, then the tracked prefixes most used while they fit its free
    memory beside the hot set (they are unpinned: later warmups may evict them)."""
    for op in list(p.tracker.hot.values()):
        await p.out.op(op.model_copy(update={"op": "warm_on", "target_worker": event.worker_id}))
    await plan_hot(p)
    if not p.settings.track_queries:
        return
    per_token = p.stats.get("kv_bytes_per_token") or p.settings.kv_bytes_per_token
    # Room the hot set takes (its share at most); what it leaves unused is not kept empty.
    hot = sum(len(op.token_ids) for op in p.tracker.hot.values()) * per_token
    reserve = min(hot, int(p.settings.hot_share * event.mem_total_bytes))
    budget = event.mem_total_bytes - event.mem_used_bytes - reserve
    # The hot set is keyed by the hash queries reported; its ops may name a newer prefix.
    sent = set(p.tracker.hot) | {op.prefix_hash for op in p.tracker.hot.values()}
    # The tracked prefixes live in every partition of the prefixes table: each owner warms
    # its own, within its share of the budget.
    await p.out.ready(
        ReadyRewarm(worker_id=event.worker_id, budget_bytes=max(0, budget), skip=sorted(sent))
    )


async def on_ready_rewarm(p: HandlerDeps, req: ReadyRewarm) -> None:
    """Warm on `req.worker_id` the tracked prefixes most used of this partition (or of every
    local one) while they fit its share of the budget; least used first, so the worker's
    LRU evicts those before the ones most in use (they are unpinned)."""
    now = p.clock()
    per_token = p.stats.get("kv_bytes_per_token") or p.settings.kv_bytes_per_token
    tracked = [
        (h, PrefixState.model_validate(v))
        for h, v in list(p.tables.prefixes.items())
        if v and (req.partition is None or p.partition_of(h, req.partitions) == req.partition)
    ]
    counts = {h: c for h, c, _ in p.tracker.ranked(now)}
    states = dict(tracked)
    share = req.budget_bytes // max(1, req.partitions if req.partition is not None else 1)
    chosen = logic.plan_rewarm(tracked, now, share, per_token, req.skip, counts)
    for prefix_hash in reversed(chosen):
        state = states[prefix_hash]
        await p.out.op(
            PrefixOp(
                op="warm_on",
                prefix_hash=prefix_hash,
                tenant=state.tenant,
                chunk_refs=state.chunk_refs,
                target_worker=req.worker_id,
                reason="worker ready",
            )
        )


async def sweep_prefixes(p: HandlerDeps) -> int:
    """Ask for the prefixes expired `forget_after_s` ago that nobody holds to be dropped,
    and for the edit holds older than `edit_hold_s` to end.

    A timer runs this over the local table; the `forget` op goes through prefix-ops, so the
    partition that owns each prefix rechecks and drops it (a use in between keeps it).
    """
    now, after = p.clock(), p.settings.forget_after_s
    workers = p.live_workers()
    sent = 0
    for prefix_hash, raw in list(p.tables.prefixes.items()):
        if not raw:
            continue
        state = PrefixState.model_validate(raw)
        if logic.hold_ended(state, now, p.settings.edit_hold_s):
            await p.out.op(PrefixOp(op="cool", prefix_hash=prefix_hash, tenant=state.tenant,
                                    hold=True, reason="edit hold ended unasked"))
            sent += 1
        if logic.forgettable(prefix_hash, state, workers, now, after):
            await p.out.op(
                PrefixOp(
                    op="forget",
                    prefix_hash=prefix_hash,
                    tenant=state.tenant,
                    reason=f"expired {now - state.expires_at:.0f} s ago, held by no worker",
                )
            )
            sent += 1
    return sent


async def resend_prefills(p: HandlerDeps) -> int:
    """Ask again for prefills no ready worker confirmed within `PREFILL_WAIT_S` (lost,
    refused, expired, or their worker died): the owning partition rechecks and sends the
    prefill to another worker if it can. Runs on a timer; returns how many it asked for."""
    now, workers = p.clock(), p.live_workers()
    window = logic.PREFILL_WAIT_S + p.settings.worker_stale_s + 2 * p.settings.resend_s
    sent = 0
    for prefix_hash, raw in list(p.tables.prefixes.items()):
        if not raw:
            continue
        state = PrefixState.model_validate(raw)
        if state.resends >= p.settings.prefill_resends:
            continue
        if logic.needs_resend(prefix_hash, state, workers, now, window):
            reason = f"prefill sent {now - (state.prefill_at or now):.0f} s ago, unconfirmed"
            await p.out.op(
                PrefixOp(op="resend", prefix_hash=prefix_hash, tenant=state.tenant, reason=reason)
            )
            sent += 1
    return sent


# --- rag.queries (key tenant) ----------------------------------------------------------------


async def on_query(p: HandlerDeps, query: QueryEvent) -> None:
    payload = HotPayload(
        tenant=query.tenant,
        question=query.question,
        chunk_refs=tuple(query.chunk_refs),
        prefix_tokens=query.prefix_tokens,
    )
    p.tracker.observe(query.prefix_hash, payload, p.clock())
    p.stats["queries"] += 1
    if p.settings.track_queries:
        op = await query_warm_op(p, query)
        if op is not None:
            await p.out.op(op)


async def query_warm_op(p: HandlerDeps, query: QueryEvent) -> PrefixOp | None:
    """Keep the prefix an answered query used warm (TTL) and linked to its chunks, so an
    edit to them re-warms what the question retrieves then. None when nothing would change:
    the prefix is known, held by a worker, far from expiry and already lists the question."""
    if not query.prefix_hash or not query.chunk_refs:
        return None
    raw = p.tables.prefixes.get(query.prefix_hash)
    if raw is None:
        prefix = await p.blocking(p.rag.prefix_for_refs, query.chunk_refs, query.tenant)
        if prefix is None or prefix.prefix_hash != query.prefix_hash:
            return None  # its chunks changed since it was asked: the KB change handles that
        return warm_op(prefix, query.tenant, query.question, reason="query")
    state = PrefixState.model_validate(raw)
    fresh = state.expires_at - p.clock() > p.settings.prefix_ttl_s / 2
    # Cheap checks first: this runs for every query, the worker rows only when needed.
    # A held prefix's ask ends its hold (`logic._warm`), so it is always sent.
    if fresh and query.question in state.questions and state.held_at is None:
        if logic.holders_of(query.prefix_hash, p.live_workers()):
            return None
    # The state has the tokens; the op only refreshes the TTL and the question list.
    return PrefixOp(
        op="warm",
        prefix_hash=query.prefix_hash,
        tenant=query.tenant,
        chunk_refs=state.chunk_refs,
        question=query.question,
        reason="query",
    )


async def plan_hot(p: HandlerDeps) -> None:
    """Warm the hottest prefixes that fit the hot-token share; release those that cooled."""
    if not p.settings.hot_tokens:
        return
    async with p.hot_lock:
        await _plan_hot(p)


async def _plan_hot(p: HandlerDeps) -> None:
    ranked = p.tracker.ranked(p.clock())
    ready = [w for w in p.live_workers() if w.ready]
    budget = int(p.settings.hot_share * sum(w.mem_total for w in ready) * p.owned_share())
    per_token = p.stats.get("kv_bytes_per_token") or p.settings.kv_bytes_per_token
    candidates = [logic.HotCandidate(h, c, pl.prefix_tokens) for h, c, pl in ranked]
    hot, cooled = logic.plan_hot_set(
        candidates, budget, per_token, p.tracker.hot, p.settings.hot_min_count
    )
    payloads = {h: pl for h, _, pl in ranked}
    held = {h for w in p.live_workers() if w.ready for h in w.prefixes}
    for prefix_hash in hot:
        known = p.tracker.hot.get(prefix_hash)
        # New to the hot set, or still hot but on no worker (a refused or lost prefill, an
        # eviction): warm what it retrieves now; the prefix op itself waits for a prefill
        # already on its way.
        if known is None or known.prefix_hash not in held:
            op = await hot_warm_op(p, prefix_hash, payloads[prefix_hash])
            if op is not None:
                p.tracker.hot[prefix_hash] = op
                await p.out.op(op)
    for prefix_hash in cooled:
        # An invalidation (`tracker.forget`) may have dropped it while this plan awaited.
        op = p.tracker.hot.pop(prefix_hash, None)
        if op is None:
            continue
        await p.out.op(
            PrefixOp(op="cool", prefix_hash=op.prefix_hash, tenant=op.tenant, reason="cooled down")
        )


async def hot_warm_op(p: HandlerDeps, prefix_hash: str, payload: HotPayload) -> PrefixOp | None:
    prefix = await p.blocking(p.rag.prefix_for_refs, list(payload.chunk_refs), payload.tenant)
    if prefix is None or prefix.prefix_hash != prefix_hash:
        # The query's chunks changed since it was asked: warm what it would retrieve now.
        prefix = await p.blocking(p.rag.prefix_for_question, payload.question, payload.tenant)
    if prefix is None:
        return None
    return warm_op(prefix, payload.tenant, payload.question, pin=True)
