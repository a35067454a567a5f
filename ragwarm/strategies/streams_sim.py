"""event-rag, hot-tokens and hybrid: the streams app's decisions, run synchronously.

Every decision is taken by `streams.logic` and `streams.hot`, the code the Faust agents
run; this module is the agents' glue (`streams/agents.py`) without Kafka: tables are dicts,
the internal topics one in-order queue, the commands topic a direct call on the worker,
and time the simulated clock.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING, ClassVar

from ragwarm.strategies.policies import Policy, PolicyContext
from schemas import ChunkRef, KbChange, QueryEvent
from streams import logic
from streams.agents import warm_op
from streams.hot import HotPayload, HotTracker
from streams.records import DocLink, DocState, PrefixOp, PrefixState

if TYPE_CHECKING:
    from rag.index import IndexResult


class StreamsPolicy(Policy):
    """The streams app with some of its inputs: KB events, query registration, hot tokens."""

    kb_events: ClassVar[bool] = False
    track_queries: ClassVar[bool] = False
    hot: ClassVar[bool] = False

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        s = ctx.settings
        self.docs: dict[str, DocState] = {}
        self.doc_prefixes: dict[str, dict[str, list]] = {}
        self.prefixes: dict[str, PrefixState] = {}
        self.tracker = HotTracker(window_s=s.hot_window_s, step_s=s.hot_step_s)
        self.queue: deque[PrefixOp | DocLink] = deque()
        self.stats: Counter[str] = Counter()
        self.next_hot = 0.0

    # -- hooks ---------------------------------------------------------------------

    def start(self) -> None:
        if self.kb_events:
            self.docs = _doc_table(self.ctx)

    def tick(self, now: float) -> None:
        if self.hot and now >= self.next_hot:
            self.plan_hot(now)
            self.next_hot = now + self.ctx.settings.hot_tick_s

    def kb_change(self, change: KbChange, result: IndexResult) -> None:
        if not self.kb_events:
            return
        prior = self.docs.get(change.doc_id)
        if logic.is_stale(change, prior) or not result.applied:
            self.stats["stale_events"] += 1
            return
        new_chunks = {c.chunk_id: c.content_hash for c in result.chunks}
        links = self.doc_prefixes.get(change.doc_id) or {}
        dependents = {h: [ChunkRef.model_validate(r) for r in refs] for h, refs in links.items()}
        plan = logic.plan_kb_change(change, prior, new_chunks, dependents, self.ctx.clock())
        assert plan.state is not None  # not stale: plan_kb_change always sets it
        self.docs[change.doc_id] = plan.state
        self.stats["kb_events"] += 1
        self.queue.extend(plan.ops)
        self.drain()

    def served(self, query: QueryEvent) -> None:
        if self.hot:
            payload = HotPayload(tenant=query.tenant, question=query.question,
                                 chunk_refs=tuple(query.chunk_refs),
                                 prefix_tokens=query.prefix_tokens)
            self.tracker.observe(query.prefix_hash, payload, self.ctx.clock())
        if self.track_queries and query.chunk_refs:
            # The query names the prefix it used: keep it warm and linked to its documents.
            prefix = self.ctx.rag.prefix_for_refs(query.chunk_refs, query.tenant)
            if prefix is not None:
                self.queue.append(warm_op(prefix, query.tenant, query.question))
                self.drain()

    # -- the agents' glue ----------------------------------------------------------

    def drain(self) -> None:
        while self.queue:
            item = self.queue.popleft()
            if isinstance(item, DocLink):
                self.on_doc_link(item)
            else:
                self.on_prefix_op(item)

    def on_prefix_op(self, op: PrefixOp) -> None:
        rag = self.ctx.rag
        if op.op in ("warm", "warm_on") and not rag.refs_current(op.chunk_refs, op.tenant):
            self.stats["stale_warm_skipped"] += 1  # never prefill from outdated chunk text
            return
        if op.op == "invalidate":
            self.tracker.forget(op.prefix_hash)
        state = self.prefixes.get(op.prefix_hash)
        workers = [self.ctx.worker.heartbeat()]
        plan = logic.plan_prefix_op(op, state, workers, self.ctx.clock(),
                                    self.ctx.settings.prefix_ttl_s)
        self.apply_plan(plan, op)

    def apply_plan(self, plan: logic.PrefixPlan, op: PrefixOp) -> None:
        for cmd in plan.commands:
            self.ctx.worker.apply(cmd)
        if plan.state is None:
            self.prefixes.pop(op.prefix_hash, None)
        else:
            self.prefixes[op.prefix_hash] = plan.state
        self.queue.extend(plan.links)
        self.stats.update(plan.counters)
        if op.reason.startswith("re-prefill") and plan.counters.get("prefills"):
            self.stats["re_prefills"] += 1
        for question in plan.rewarm_questions[: self.ctx.settings.rewarm_questions]:
            prefix = self.ctx.rag.prefix_for_question(question, op.tenant)
            if prefix is not None:
                self.queue.append(warm_op(prefix, op.tenant, question, op, pin=plan.rewarm_pin))

    def on_doc_link(self, link: DocLink) -> None:
        current = self.doc_prefixes.get(link.doc_id) or {}
        links, stale = logic.plan_doc_link(current, link, self.docs.get(link.doc_id))
        self.doc_prefixes[link.doc_id] = links
        if stale is not None:
            self.queue.append(stale)

    def plan_hot(self, now: float) -> None:
        """Warm the hottest prefixes within the hot share; release those that cooled."""
        ranked = self.tracker.ranked(now)
        worker = self.ctx.worker.heartbeat()
        budget = int(self.ctx.settings.hot_share * worker.mem_total)
        per_token = self.ctx.worker.engine.kv_bytes_per_token
        candidates = [logic.HotCandidate(h, c, pl.prefix_tokens) for h, c, pl in ranked]
        hot, cooled = logic.plan_hot_set(candidates, budget, per_token, self.tracker.hot,
                                         self.ctx.settings.hot_min_count)
        payloads = {h: pl for h, _, pl in ranked}
        for prefix_hash in hot:
            if prefix_hash not in self.tracker.hot:
                op = self.hot_warm_op(prefix_hash, payloads[prefix_hash])
                if op is not None:
                    self.tracker.hot[prefix_hash] = op
                    self.queue.append(op)
        for prefix_hash in cooled:
            old = self.tracker.hot.pop(prefix_hash)
            self.queue.append(PrefixOp(op="cool", prefix_hash=old.prefix_hash,
                                       tenant=old.tenant, reason="cooled down"))
        self.drain()

    def hot_warm_op(self, prefix_hash: str, payload: HotPayload) -> PrefixOp | None:
        rag = self.ctx.rag
        prefix = rag.prefix_for_refs(list(payload.chunk_refs), payload.tenant)
        if prefix is None or prefix.prefix_hash != prefix_hash:
            prefix = rag.prefix_for_question(payload.question, payload.tenant)
        if prefix is None:
            return None
        return warm_op(prefix, payload.tenant, payload.question, pin=True)


def _doc_table(ctx: PolicyContext) -> dict[str, DocState]:
    """The `docs` table as the KB-change agent leaves it after the initial state."""
    store, tenant = ctx.rag.store, ctx.tenant
    chunks: dict[str, dict[str, str]] = {}
    for stored in store.all_chunks(tenant):
        chunks.setdefault(stored.chunk.doc_id, {})[stored.chunk.chunk_id] = (
            stored.chunk.content_hash
        )
    return {
        r.doc_id: DocState(version=r.version, tenant=tenant, chunks=chunks.get(r.doc_id, {}),
                           deleted=r.deleted)
        for r in store.doc_records(tenant)
        if r.version is not None  # a first write still under way has no version yet
    }


class EventRag(StreamsPolicy):
    """`event-rag`: the prefixes queries use are kept warm (TTL) and linked to their chunks;
    a KB change invalidates the ones it made stale, re-retrieves the questions behind them
    and prefills the new top-3 prefixes, and extends the TTL of the others."""

    name: ClassVar[str] = "event-rag"
    # The app decides what is cached: every entry is a prefix it tracks and can re-warm.
    cache_requests: ClassVar[bool] = False
    kb_events: ClassVar[bool] = True
    track_queries: ClassVar[bool] = True


class HotTokens(StreamsPolicy):
    """`hot-tokens`: heavy-hitter prefixes over hopping windows pinned within `hot_share`
    of memory, released when they cool (seed 000's dynamic hot-token warmup); request
    caching for the rest."""

    name: ClassVar[str] = "hot-tokens"
    hot: ClassVar[bool] = True


class Hybrid(StreamsPolicy):
    """`hybrid`: event-rag plus hot-tokens (the streams app with every input)."""

    name: ClassVar[str] = "hybrid"
    cache_requests: ClassVar[bool] = False
    kb_events: ClassVar[bool] = True
    track_queries: ClassVar[bool] = True
    hot: ClassVar[bool] = True
