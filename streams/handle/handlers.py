"""What the streams app does with each record: look state up, call `streams.decide.logic`, send.

The handlers know nothing of Faust or Kafka. They read and write the tables through plain
mappings and send through an `Outbox`: the Faust agents (`streams/shell/agents.py`) give them
changelog tables and topics, the strategies benchmark gives them dicts and a queue on a
simulated clock, so both run this same code.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from schemas import ChunkRef, KbChange, QueryEvent, WorkerEvent
from schemas.prefix import prefix_kv_bytes
from streams.decide import logic
from streams.decide.fleet import fold_worker_event
from streams.decide.hot import HotPayload
from streams.decide.records import (
    DocLink,
    DocState,
    PrefixOp,
    ReadyRewarm,
    WorkerState,
    doc_key,
)
from streams.decide.rent import paying
from streams.handle import catchup, chunk_warm, edits, retrieval, synthesize, tails
from streams.handle.deps import (  # noqa: F401 - re-exported: the handlers' inputs in one place
    HandlerDeps,
    Outbox,
    Readiness,
    Rows,
    StreamTables,
    Table,
)
from streams.handle.ports import WarmPrefix
from streams.handle.ready import (  # noqa: F401 - the routes' handler of worker-ready
    hot_sent,
    next_warm_step,
    on_ready_rewarm,
    tier_share,
)

log = logging.getLogger(__name__)


def warm_op(
    prefix: WarmPrefix, tenant: str, question: str | None, cause: PrefixOp | None = None,
    *, pin: bool = False, hold: bool = False, reason: str = "hot",
) -> PrefixOp:
    """A `warm` op for `prefix`; `cause` is the op whose decision led here, if any."""
    return PrefixOp(
        op="warm",
        prefix_hash=prefix.prefix_hash,
        tenant=tenant,
        chunk_refs=prefix.chunk_refs,
        token_ids=prefix.token_ids,
        chunk_spans=prefix.chunk_spans,
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


# KB changes in batches (the Faust agent's bulk form): one index call, embeddings batched
# across documents, then each change recorded in order as `on_kb_change` records one.


def live_changes(docs: Rows[DocState], changes: Sequence[KbChange]) -> list[bool]:
    """Per change, whether it is newer than the docs table and the batch's earlier changes
    of its document; older ones index nothing."""
    newest: dict[str, int] = {}
    live = []
    for change in changes:
        key = doc_key(change.tenant, change.doc_id)
        version = newest.get(key)
        if version is None:
            prior = docs.get(key)
            version = prior.version if prior is not None else None
        stale = change.is_stale(version)
        live.append(not stale)
        if not stale:
            newest[key] = change.version
    return live


async def index_batch(p: HandlerDeps, changes: Sequence[KbChange]) -> list[dict[str, str] | None]:
    """Index the live changes in one call, in order; per change its chunk hashes after it
    (None: older than what the table or the store holds)."""
    live = live_changes(p.tables.doc_states, changes)
    todo = [c for c, ok in zip(changes, live, strict=True) if ok]
    indexed = iter(await p.blocking(p.rag.index_many, todo) if todo else [])
    if todo:
        await publish_indexed(p)
    return [next(indexed) if ok else None for ok in live]


async def publish_indexed(p: HandlerDeps) -> None:
    """Publish what was just indexed before anything that depends on it is sent (the ops
    it leads to may be handled by an instance whose replica must hold the new chunks)."""
    if p.replica is not None:
        await p.replica.publish()


async def caught_up(p: HandlerDeps) -> None:
    """Bring the index replica up to what every instance published (read-your-writes): an op
    an edit elsewhere led to follows its published chunks, which a lagging replica has not
    applied (old refs pass, old prefixes retrieved). A wait that runs out (counted) stops."""
    if p.replica is not None:
        await p.replica.caught_up(since=catchup.arrived())  # once per batch or tick


async def refs_current(p: HandlerDeps, refs: list[ChunkRef], tenant: str) -> bool:
    """Whether the refs are current once the replica caught up (else an unseen edit passes)."""
    await caught_up(p)
    return await p.blocking(p.rag.refs_current, refs, tenant)


def stale_in_table(p: HandlerDeps, change: KbChange) -> bool:
    """Whether the docs table already holds a newer version (a replay): nothing to index."""
    prior = p.tables.doc_states.get(doc_key(change.tenant, change.doc_id))
    return change.is_stale(prior.version if prior else None)


async def apply_indexed(
    p: HandlerDeps, change: KbChange, new_chunks: dict[str, str] | None
) -> None:
    """Record an indexed change and send an op per dependent prefix; `new_chunks` is what
    indexing returned (None: older than the table, or the store holds a newer version)."""
    key = doc_key(change.tenant, change.doc_id)
    prior = p.first_prior(key, change.version)  # as the first attempt found it
    if new_chunks is None or change.is_stale(prior.version if prior else None):
        p.applying.pop((key, change.version), None)
        p.stats["stale_events"] += 1
        return
    dependents = p.tables.dependents(key)
    now = p.clock()
    recent, budget = edits.candidates(p, dependents, now), edits.edit_budget(p)
    plan = logic.plan_kb_change(change, prior, new_chunks, dependents, now, recent,
                                budget.tokens, edits.older(p, dependents, recent),
                                budget.older_tokens, rewarm_rest=budget.rest)
    assert plan.state is not None  # not stale, so the plan carries the new state
    p.tables.doc_states[key] = plan.state
    p.stats["kb_events"] += 1
    for op in plan.ops:
        await p.out.op(op)
    if plan.state.chunks != (prior.chunks if prior else None):
        await edits.recheck_others(p, change, new_chunks, dependents, plan.ops, recent,
                                   budget.tokens)
    await chunk_warm.warm_changed(p, change, prior, new_chunks, bool(dependents))
    await synthesize.on_kb_changed(p, prior, plan.state, change.doc_id)
    p.applying.pop((key, change.version), None)  # done: a later change reads the table


# --- ragwarm.prefix-ops (key prefix hash) ----------------------------------------------------


async def on_prefix_op(p: HandlerDeps, op: PrefixOp) -> None:
    # Only this agent writes it, one op at a time.
    state = p.tables.prefix_states.get(op.prefix_hash)
    if op.op in ("warm", "warm_on") and not await refs_current(p, op.chunk_refs, op.tenant):
        # Never prefill KV from text no longer current; a prefix built from it is invalidated.
        p.stats["stale_warm_skipped"] += 1
        if (stale := logic.stale_prefix_invalidation(op, state)) is None:
            return
        p.stats["stale_prefixes_dropped"] += 1
        op = stale
    if op.op == "invalidate":
        p.tracker.forget(op.prefix_hash)
    plan = logic.plan_prefix_op(op, state, p.live_workers(), p.clock(), p.settings.prefix_ttl_s)
    await apply_plan(p, plan, op)


async def apply_plan(p: HandlerDeps, plan: logic.PrefixPlan, op: PrefixOp) -> None:
    """Send what the plan says, then write the prefix's new state: effects before state.
    An op is redone whole when it did not finish (a transient failure retried here, or a
    crash replayed by the instance taking the partition over); had the state gone first, an
    invalidation redone would find no questions to re-warm, and the edit's re-warm is lost."""
    for cmd in plan.commands:
        await p.out.command(logic.with_expiry(cmd, p.clock(), p.settings.command_expiry_s))
    await tails.send_question_tails(p, plan)
    for link in plan.links:
        await p.out.link(link)
    questions = plan.rewarm_questions[: p.settings.rewarm_questions]
    if questions:
        await caught_up(p)  # retrieve over the edit that invalidated it, wherever indexed
    for batch in retrieval.batches(questions):
        prefixes = await p.blocking(retrieval.prefixes_for_questions, p.rag, batch, op.tenant)
        for question, prefix in zip(batch, prefixes, strict=True):
            if prefix is not None:
                await p.out.op(warm_op(prefix, op.tenant, question, op, pin=plan.rewarm_pin,
                                       hold=plan.rewarm_hold))
    if plan.state is None:
        p.tables.prefixes.pop(op.prefix_hash, None)
    else:
        p.tables.prefix_states[op.prefix_hash] = plan.state
    p.stats.update(plan.counters)
    if op.reason.startswith("re-prefill") and plan.counters.get("prefills"):
        p.stats["re_prefills"] += 1


# --- ragwarm.doc-links (key tenant + doc_id) ----------------------------------------------


async def on_doc_link(p: HandlerDeps, link: DocLink) -> None:
    key = doc_key(link.tenant, link.doc_id)
    doc = p.tables.doc_states.get(key)
    links, stale = logic.plan_doc_link(p.tables.doc_prefixes.get(key) or {}, link, doc)
    p.tables.doc_prefixes[key] = links
    if stale is not None:
        await p.out.op(stale)


# --- worker.events (global table) ------------------------------------------------------------


IGNORED_EVENTS = {"unauthenticated": "unauthenticated_events", "old": "stale_epoch_events",
                  "future": "future_epoch_events"}


async def on_worker_event(p: HandlerDeps, event: WorkerEvent) -> None:
    secret = p.settings.worker_events_secret
    prior = p.tables.worker_states.get(event.worker_id)
    order, state = fold_worker_event(prior, event, p.clock(), p.epoch_check(prior),
                                     secret.get_secret_value() if secret else None)
    if state is None:  # forged; a leftover of a previous boot; a clock far ahead
        p.stats[IGNORED_EVENTS[order]] += 1
        return
    if order == "new" and prior is not None:
        # Restarted (a crash leaves no `stopped`): whatever the row listed is gone.
        p.stats["worker_restarts"] += 1
        log.info("worker %s: new boot %s, its device cache starts empty (%d prefixes on its "
                 "disk tier)", event.worker_id, event.epoch, len(event.tier_prefixes))
    if event.kind == "expired":
        p.stats["expired_commands"] += 1
    p.tables.worker_states[event.worker_id] = state
    if event.kind == "stored" and event.prefix_tokens:
        p.stats["kv_bytes_per_token"] = event.bytes // event.prefix_tokens
    if event.kind == "stored" and event.command_id and event.prefix_hash:  # a prefill landed
        await p.out.op(PrefixOp(op="stored", prefix_hash=event.prefix_hash, reason="stored"))
    if event.kind == "ready":
        await warm_new_worker(p, event)
    elif event.kind == "heartbeat":
        await next_warm_step(p, state)
    elif event.kind == "synthesized":
        await synthesize.on_synthesized(p, event)


async def warm_new_worker(p: HandlerDeps, event: WorkerEvent) -> None:
    """A worker that (re)started holds nothing: send it the hot set, re-plan the hot set
    with its memory added, then the tracked prefixes most used while they fit its free
    memory beside the hot set (they are unpinned: later warmups may evict them), in
    `warmup_steps` growing steps (`streams.decide.progressive`): the first one now."""
    for op in list(p.tracker.hot.values()):
        await p.out.op(op.model_copy(update={"op": "warm_on", "target_worker": event.worker_id}))
    await plan_hot(p)
    # After the plan: a first ready has no hot set before it.
    await chunk_warm.warm_ready(p, event.worker_id)
    if not p.settings.track_queries:
        return
    per_token = p.kv_bytes_per_token()
    # Room the hot set takes (its share at most); what it leaves unused is not kept empty.
    hot = sum(prefix_kv_bytes(len(op.token_ids), per_token) for op in p.tracker.hot.values())
    reserve = min(hot, int(p.settings.hot_share * event.mem_total_bytes))
    budget = event.mem_total_bytes - event.mem_used_bytes - reserve
    sent = hot_sent(p)
    # Tracked prefixes are in every partition of the prefixes table: each owner warms its own.
    steps = p.settings.warmup_steps
    row = p.tables.worker_states[event.worker_id]
    req = ReadyRewarm(
        worker_id=event.worker_id, budget_bytes=max(0, budget), skip=sent, steps=steps,
        tier_bytes=tier_share(p, row) if steps == 1 else 0,
    )
    # The later steps go after its heartbeats (`next_warm_step`), with the same budget.
    progress = {"warm_step": 2 if steps > 1 else 0, "warm_steps": steps,
                "warm_budget": req.budget_bytes}
    p.tables.worker_states[event.worker_id] = row.model_copy(update=progress)
    await p.out.ready(req)


async def sweep_prefixes(p: HandlerDeps) -> int:
    """Ask for the prefixes expired `forget_after_s` ago that nobody holds to be dropped,
    and for the edit holds older than `edit_hold_s` to end.

    A timer runs this over the local table; the `forget` op goes through prefix-ops, so the
    partition that owns each prefix rechecks and drops it (a use in between keeps it).
    """
    now, after = p.clock(), p.settings.forget_after_s
    workers = p.live_workers()
    sent = 0
    for prefix_hash, state in p.tables.prefix_states.items():
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
    for prefix_hash, state in p.tables.prefix_states.items():
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
    if count_query(p, query):
        await send_query_op(p, query)


def count_query(p: HandlerDeps, query: QueryEvent) -> bool:
    """A query's bookkeeping (hot-token window, ask log, counters); True when its prefix is
    due a warm op (`send_query_op`), apart so that a retried op does not count it twice."""
    payload = HotPayload(tenant=query.tenant, question=query.question,
                         chunk_refs=tuple(query.chunk_refs), prefix_tokens=query.prefix_tokens)
    p.tracker.observe(query.prefix_hash, payload, p.clock())
    if query.prefix_hash and p.settings.edit_watch:
        p.asks.observe(query.prefix_hash, query.tenant, query.question, query.chunk_refs,
                       query.prefix_tokens, p.clock())
    p.stats["queries"] += 1
    synthesize.count_query(p, query)
    every = p.settings.query_op_interval_s  # `decide.pacing`: one op per prefix per interval
    key = query.prefix_hash or ""  # none: query_warm_op sends nothing
    return p.settings.track_queries and p.query_ops.due(key, p.clock(), every)


async def send_query_op(p: HandlerDeps, query: QueryEvent) -> None:
    """The warm op of a counted query whose prefix is due one (`count_query`)."""
    if (op := await query_warm_op(p, query)) is not None:
        every = p.settings.query_op_interval_s
        p.query_ops.sent(query.prefix_hash or "", p.clock(), every)
        await p.out.op(op)


async def query_warm_op(p: HandlerDeps, query: QueryEvent) -> PrefixOp | None:
    """Keep a query's prefix warm (TTL) and linked to its chunks, so an edit re-warms what it
    retrieves then. None when nothing would change: known, held, fresh, question listed."""
    if not query.prefix_hash or not query.chunk_refs:
        return None
    state = p.tables.prefix_states.get(query.prefix_hash)
    if state is None:
        prefix = await p.blocking(p.rag.prefix_for_refs, query.chunk_refs, query.tenant)
        if prefix is None or prefix.prefix_hash != query.prefix_hash:
            # Chunks changed since, or a client's own prompt template: not asked per query.
            p.query_ops.sent(query.prefix_hash, p.clock(), p.settings.query_op_interval_s)
            p.stats["query_prefix_unmatched"] += 1
            return None
        return warm_op(prefix, query.tenant, query.question, reason="query")
    fresh = state.expires_at - p.clock() > p.settings.prefix_ttl_s / 2
    # Cheap checks first (every query runs this); a held prefix's ask ends its hold: sent.
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
    await chunk_warm.warm_window(p)


async def _plan_hot(p: HandlerDeps) -> None:
    now, retry = p.clock(), p.settings.hot_unfound_retry_s
    ranked = p.tracker.ranked(now)
    ready = [w for w in p.live_workers() if w.ready]
    memory = sum(w.mem_total for w in ready) * p.owned_share()
    budget, per_token, s = int(p.settings.hot_share * memory), p.kv_bytes_per_token(), p.settings
    candidates = paying(p.tracker.rent, ranked, (memory - budget) / per_token, now, s)
    hot, cooled = logic.plan_hot_set(candidates, budget, per_token, p.tracker.hot, s.hot_min_count)
    payloads = {h: pl for h, _, pl in ranked}
    held = {h for w in ready for h in w.prefixes}
    # New to the hot set, or still hot but on no worker (a refused or lost prefill, an
    # eviction): warm what it retrieves now, all of them retrieved together; one whose
    # prefill is on its way waits (retrieving again each tick takes CPU from it), as does
    # one whose question retrieved nothing lately (`hot_unfound_retry_s`).
    todo = [h for h in hot if _needs_warm(p, p.tracker.hot.get(h), held)
            and p.hot_unfound.due(h, now, retry)]
    if todo:  # else a lagging replica names the old prefix of an edited chunk
        await caught_up(p)
    prefixes = await retrieval.hot_prefixes(p, {h: payloads[h] for h in todo})
    for prefix_hash in hot:
        if prefix_hash in prefixes:
            prefix, payload = prefixes[prefix_hash], payloads[prefix_hash]
            if prefix is None:
                p.hot_unfound.sent(prefix_hash, now, retry)  # not every tick: same answer
                continue
            warm = warm_op(prefix, payload.tenant, payload.question, pin=True)
            p.tracker.hot[prefix_hash] = warm
            await p.out.op(warm)
            await warm_per_node(p, warm, ready, owner_picks=True)
        elif (known := p.tracker.hot.get(prefix_hash)) is not None and known.prefix_hash in held:
            await warm_per_node(p, known, ready)
    for prefix_hash in cooled:
        # An invalidation (`tracker.forget`) may have dropped it while this plan awaited.
        op = p.tracker.hot.pop(prefix_hash, None)
        if op is None:
            continue
        await p.out.op(PrefixOp(op="cool", prefix_hash=op.prefix_hash, tenant=op.tenant,
                                reason="cooled down"))


def _needs_warm(p: HandlerDeps, known: PrefixOp | None, held: set[str]) -> bool:
    """Whether a hot prefix is to be retrieved and warmed this tick (`_plan_hot`)."""
    if known is not None and known.prefix_hash in held:
        return False
    return known is None or not _prefill_pending(p, known.prefix_hash)


def _prefill_pending(p: HandlerDeps, prefix_hash: str) -> bool:
    # None where another instance owns it.
    return logic.prefill_pending(p.tables.prefix_states.get(prefix_hash), p.clock())


async def warm_per_node(
    p: HandlerDeps, op: PrefixOp, ready: list[WorkerState], *, owner_picks: bool = False
) -> None:
    """Warm a hot prefix on a worker of every node that holds none (`logic.hot_targets`).

    `owner_picks`: an untargeted op was just sent, and the prefix's owner places it on the
    worker `choose_worker` picks; that worker's node is covered by it.
    """
    picked = logic.choose_worker(ready, [op.prefix_hash]) if owner_picks else None
    covered = {w.node for w in ready if w.worker_id == picked}
    for worker in logic.hot_targets(op.prefix_hash, ready):
        if next(w.node for w in ready if w.worker_id == worker) in covered:
            continue
        p.stats["hot_per_node"] += 1
        await p.out.op(op.model_copy(update={"op": "warm_on", "target_worker": worker}))
