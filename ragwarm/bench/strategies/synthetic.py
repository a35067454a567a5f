"""`synthetic`: seed 000's batched synthetic requests, on top of request caching.

The streams app with synthetic warmup on (`streams.handle.synthesize`): a document that has just
changed, or whose prefixes are hot, gets a few questions sampled by the worker's own model
(SmolLM2 in the benchmark, seeded so a run repeats), and their top-3 prefixes are warmed
on the worker within 5% of its memory. KB changes invalidate what they make stale, as in
`event-rag`; no other prefix is warmed. Reports the KV share the synthetic prefixes hold and
how many first asks of a question hit one.
"""

from __future__ import annotations

from typing import ClassVar

from ragwarm.bench.strategies.metrics import mean
from ragwarm.bench.strategies.policies import PolicyContext
from ragwarm.bench.strategies.streams_policy import StreamsPolicy
from schemas import QueryEvent
from schemas.prefix import warm_hit
from streams.decide.records import PrefixState
from streams.handle import synthesize
from streams.sim import run_sync


class Synthetic(StreamsPolicy):
    name: ClassVar[str] = "synthetic"
    kb_events: ClassVar[bool] = True
    needs_model: ClassVar[bool] = True  # the worker's model samples its questions

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        p = self.pipeline
        p.settings = p.settings.model_copy(update={
            "synthetic": True,
            "synthetic_seed": ctx.settings.seed,  # the workload's seed: a rerun repeats
        })
        self.next_synthetic = 0.0
        self.asked: set[str] = set()
        self.first_asks = 0
        self.first_hits = 0
        self.shares: list[float] = []

    def tick(self, now: float) -> None:
        super().tick(now)
        if now >= self.next_synthetic:
            run_sync(synthesize.tick(self.pipeline))  # the app's synthetic-tick timer
            self.next_synthetic = now + self.pipeline.settings.hot_tick_s
            self.drain()

    def served(self, query: QueryEvent) -> None:
        self.shares.append(self.synthetic_share())
        key = query.qid or query.question
        if key not in self.asked:
            self.asked.add(key)
            self.first_asks += 1
            self.first_hits += self.hit_synthetic(query)
        super().served(query)

    def hit_synthetic(self, query: QueryEvent) -> bool:
        """Whether the query took its whole prefix from a prefix warmed synthetically."""
        raw = self.pipeline.tables.prefixes.get(query.prefix_hash or "")
        if not raw or not PrefixState.model_validate(raw).synthetic:
            return False
        block = self.ctx.worker.engine.block_size
        return warm_hit(query.cached_tokens, query.prefix_tokens, block)

    def synthetic_share(self) -> float:
        """KV the worker holds for synthetic prefixes, as a share of its budget (an entry's
        bytes counted whole, even where it shares blocks with a request-cached one)."""
        cache = self.ctx.worker.cache
        warmed = self.pipeline.synthetic.held.get(self.ctx.worker.worker_id, {})
        held = sum(e.nbytes for e in cache.entries() if e.prefix_hash in warmed)
        return held / (cache.budget.max_bytes or 1)

    def figures(self) -> dict[str, float | int | None]:
        stats = self.pipeline.stats
        return {
            "synthetic_memory_share": round(mean(self.shares), 4),
            "synthetic_memory_share_max": round(max(self.shares, default=0.0), 4),
            "synthetic_first_ask_hit_rate": round(self.first_hits / self.first_asks, 4)
            if self.first_asks else None,
            "first_asks": self.first_asks,
            "synthetic_first_hits": self.first_hits,
            "synthetic_requests": stats.get("synthetic_requests", 0),
            "synthetic_questions": stats.get("synthetic_questions", 0),
            "synthetic_prefixes_warmed": stats.get("synthetic_prefixes_warmed", 0),
        }
