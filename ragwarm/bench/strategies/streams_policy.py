"""event-rag, hot-tokens and hybrid: the streams app's own handlers on the simulated clock.

Each policy runs `streams.handle.handlers` (the code behind the Faust agents) on the harness of
`streams.sim`: dict tables, one in-order queue, commands that reach the policy's worker at
once, and the benchmark's clock. A policy differs from the deployed app only in which inputs
it is fed.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, ClassVar

from ragwarm.bench.strategies.policies import Policy, PolicyContext
from schemas import KbChange, QueryEvent
from streams.decide.hot import HotTracker
from streams.handle import handlers
from streams.shell.routes import route_for
from streams.sim import Item, SimOutbox, dict_tables, run_sync

if TYPE_CHECKING:
    from rag.index import IndexResult


class StreamsPolicy(Policy):
    """The streams app fed some of its inputs: KB events, hot-token ticks, query tracking."""

    kb_events: ClassVar[bool] = False
    track_queries: ClassVar[bool] = False
    hot: ClassVar[bool] = False
    chunk_warmup: ClassVar[bool] = False
    # The product's edit rules beyond event-rag's (`RAGWARM_STREAMS_EDIT_WATCH`).
    edit_watch: ClassVar[bool] = False
    eviction: ClassVar[str | None] = None  # ragwarm's worker, with its eviction policy

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        settings = ctx.settings.streams.model_copy(update={
            "track_queries": self.track_queries,
            "hot_tokens": self.hot,
            "chunk_warmup": self.chunk_warmup,
            "edit_watch": self.edit_watch,
            "kv_bytes_per_token": ctx.worker.engine.kv_bytes_per_token,
            "worker_stale_s": float("inf"),  # one worker, heartbeating on every step
            "tenant": ctx.settings.tenant,
        })
        self.queue: deque[Item] = deque()
        self.port = ctx.rag.fork()
        self.pipeline = handlers.HandlerDeps(
            tables=dict_tables(),
            out=SimOutbox(self.queue, ctx.worker.apply),
            rag=self.port,
            settings=settings,
            tracker=HotTracker(settings.hot_window_s, settings.hot_step_s, settings.hot_capacity),
            clock=ctx.clock,
        )
        if self.kb_events:
            self.pipeline.tables.docs.update(ctx.rag.doc_states(ctx.tenant))
        self.next_hot = self.next_sweep = 0.0
        ctx.worker.listeners.append(self.queue.append)  # worker.events

    @property
    def stats(self):
        return self.pipeline.stats

    # -- the policy hooks feed the app's inputs ---------------------------------------

    def logged(self, query: QueryEvent) -> None:
        # Yesterday's rag.queries: the app saw them (tables, hot windows); no worker yet.
        self.feed(query)

    def start(self) -> None:
        # The worker reports ready: the app warms what it knows to be in use.
        self.feed(self.ctx.worker.runtime.status_event("ready"))

    def tick(self, now: float) -> None:
        # The app's timers fire when they fall due, not at the step that follows: a warmup
        # a timer sends starts then, and a request of this step waits only for what is left
        # of it. Fired at the step, every timer's warmup began as a request arrived and the
        # request waited for a whole pass. Nothing else happens between two steps, so a
        # timer run at its due time sees the state it would have seen; after a long gap
        # only its first and last due times run (those between see the same state).
        hot_s, sweep_s = self.pipeline.settings.hot_tick_s, self.pipeline.settings.sweep_s
        for due, hot in _due_times(self.next_hot, hot_s, self.next_sweep, sweep_s, now):
            with self.ctx.at(due):
                self.feed(self.ctx.worker.runtime.status_event("heartbeat"))
                if hot:
                    run_sync(handlers.plan_hot(self.pipeline))  # the app's hot-tick timer
                    self.next_hot = due + hot_s
                else:
                    run_sync(handlers.sweep_prefixes(self.pipeline))  # the prefix sweep
                    self.next_sweep = due + sweep_s
                self.drain()
        self.feed(self.ctx.worker.runtime.status_event("heartbeat"))

    def kb_change(self, change: KbChange, result: IndexResult) -> None:
        if self.kb_events:
            chunks = {c.chunk_id: c.content_hash for c in result.chunks} if result.applied else None
            with self.port.handing(chunks):
                self.feed(change)

    def served(self, query: QueryEvent) -> None:
        self.feed(query)

    # -- one consumer for every topic ----------------------------------------------------

    def feed(self, item: Item) -> None:
        self.queue.append(item)
        self.drain()

    def drain(self) -> None:
        p = self.pipeline
        while self.queue:
            item = self.queue.popleft()
            # The app's own route table: the handler the agent of that topic would run.
            run_sync(route_for(item).handle(p, item))


def _due_times(next_hot: float, hot_s: float, next_sweep: float, sweep_s: float,
               now: float) -> list[tuple[float, bool]]:
    """The timer runs due by `now`, in time order: (due time, whether it is the hot tick
    rather than the sweep); each timer's first and last due time only."""
    runs: list[tuple[float, bool]] = []
    for first, every, hot in ((next_hot, hot_s, True), (next_sweep, sweep_s, False)):
        if first > now:
            continue
        runs.append((first, hot))
        last = first + every * ((now - first) // every) if every > 0 else first
        if last > first:
            runs.append((last, hot))
    return sorted(runs, key=lambda run: (run[0], not run[1]))


class EventRag(StreamsPolicy):
    """`event-rag`: the prefixes queries use are kept warm (TTL) and linked to their chunks;
    a KB change invalidates the ones it made stale, re-retrieves the questions behind them
    and prefills the new top-3 prefixes, and extends the TTL of the others. On top of the
    worker's own request caching, as deployed (warmup only adds to it)."""

    name: ClassVar[str] = "event-rag"
    kb_events: ClassVar[bool] = True
    track_queries: ClassVar[bool] = True


class HotTokens(StreamsPolicy):
    """`hot-tokens`: heavy-hitter prefixes over hopping windows pinned within `hot_share`
    of memory, released when they cool (seed 000's dynamic hot-token warmup); request
    caching for the rest."""

    name: ClassVar[str] = "hot-tokens"
    hot: ClassVar[bool] = True


def hybrid_blends() -> bool:
    """Whether the product default (`hybrid`) blends chunk KV: the one switch for it.

    On where a default worker blends: the stored calibration of the served model passes the
    quality gate (`workers.calibration.default_blending`). Such a worker blends the chunks
    other stored prompts hold into prompts no cached prefix covers, where its cost estimate
    says that is faster (issue 38).
    """
    from ragwarm.settings import ModelSettings
    from workers.calibration import default_blending

    return default_blending(ModelSettings().llm_name)


class Hybrid(StreamsPolicy):
    """`hybrid`: event-rag plus hot-tokens (the streams app with every input) on top of the
    worker's request caching (SLRU, so a prompt asked again outlives those asked once; the
    fair bench gives every policy the same eviction); a ready worker gets the hot set, then
    the tracked prefixes most used, expired or not (what `history` warms); an edit also
    re-checks recently asked questions its chunks may now serve (`edit_watch`). Its worker
    blends donated chunk KV where that is cheaper (`hybrid_blends`) and keeps the default
    host KV tier below its budget."""

    name: ClassVar[str] = "hybrid"
    host_tier: ClassVar[bool] = True
    kb_events: ClassVar[bool] = True
    track_queries: ClassVar[bool] = True
    hot: ClassVar[bool] = True
    edit_watch: ClassVar[bool] = True
    chunk_reuse: ClassVar[bool] = hybrid_blends()


class HybridNoBlend(Hybrid):
    """`hybrid-noblend`: `hybrid` with blending off (exact prefix reuse only), to read what
    blending changes side by side."""

    name: ClassVar[str] = "hybrid-noblend"
    chunk_reuse: ClassVar[bool] = False
