"""What-if replay of a logged query stream against a warmup policy, without a model.

The policy is the benchmark's own class (`policy_class`), built with the same settings and
fed the same way (`open_lane`); its worker is `SimWorker` over the model-free `CostEngine`
(the worker's cache bookkeeping, TTFT from a cost model fitted on the log), and its RAG
layer is what the log shows (`LogRag`). The log also stands for yesterday: policies that
learn from past traffic (history, scheduled, the streams app's tables) see it first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragwarm.bench.stats import percentile
from ragwarm.bench.strategies.lanes import Lane, SimClock, open_lane
from ragwarm.bench.strategies.lograg import LogRag, log_questions
from ragwarm.bench.strategies.policies import policy_class
from ragwarm.bench.strategies.settings import StrategySettings
from schemas import QueryEvent
from schemas.prefix import warm_hit
from streams.sim import SimRag
from workers.cost_engine import CostEngine, CostModel, fit_cost, make_cache
from workers.kv.blocks import BLOCK_SIZE
from workers.kv.eviction import DEFAULT_POLICY
from workers.kv.memory import DEFAULT_MAX_ENTRIES, Budget
from workers.kv.request_blocks import DEFAULT_REQUEST_CACHING
from workers.settings import HOST_TIER_PER_KV_BYTE


@dataclass
class Outcome:
    """One replayed query: what the policy would have served from cache, and its estimate."""

    event: QueryEvent
    cached_tokens: int
    hit: bool
    ttft_ms: float


def evaluate(
    events: Sequence[QueryEvent],
    policy: str,
    settings: StrategySettings,
    kv_bytes: int,
    cost: CostModel | None = None,
    block_size: int = BLOCK_SIZE,
    eviction: str = DEFAULT_POLICY,
    request_caching: str = DEFAULT_REQUEST_CACHING,
) -> tuple[list[Outcome], CostModel, Lane]:
    """Replay `events` (in timestamp order) against `policy` with a KV budget of `kv_bytes`;
    `eviction` is ragwarm's worker's: every policy's, or with `settings.same_eviction` off
    only the streams app's policies' (the others evict LRU, as vLLM); `request_caching` is
    its request caching's ("block" or "entry"), for the policies that run ragwarm's worker.
    Raises ValueError naming the valid policies for an unknown one."""
    cls = policy_class(policy)
    if cls.disk_tier:
        # The cost engine holds no tensors, so there is nothing a disk tier could read back.
        raise ValueError(f"policy {policy!r} needs the torch engine's disk tier: measure it "
                         "with `ragwarm bench strategies`")
    ordered = sorted(events, key=lambda e: e.timestamp)
    cost = cost or fit_cost(ordered)
    clock = SimClock()
    budget = Budget(kv_bytes, DEFAULT_MAX_ENTRIES, kv_bytes)
    cache = make_cache(budget, clock, block_size,
                       cls.eviction_on(eviction, same=settings.same_eviction),
                       cls.request_caching(request_caching))
    engine = CostEngine(cost, cache, model_id="offline",
                        kv_bytes_per_token=settings.streams.kv_bytes_per_token,
                        tier_bytes=HOST_TIER_PER_KV_BYTE * kv_bytes if cls.host_tier else 0)
    rag = LogRag(ordered, tenant=settings.tenant, block_size=block_size, model=engine.model_id,
                 hasher=lambda ids, tenant: engine.block_hashes(ids, tenant=tenant))
    lane = open_lane(cls, engine, clock, SimRag(rag, rag.doc_states), settings,
                     log_questions(ordered), ttft_runs=1)
    times = _times(ordered)
    _yesterday(lane, rag, ordered, times, clock, settings.mean_gap_s)
    clock.now = 0.0
    lane.policy.start()
    return [_replay(lane, rag, e, at, clock) for e, at in zip(ordered, times, strict=True)], \
        cost, lane


def _times(events: Sequence[QueryEvent]) -> list[float]:
    t0 = events[0].timestamp.timestamp() if events else 0.0
    return [e.timestamp.timestamp() - t0 for e in events]


def _yesterday(lane: Lane, rag: LogRag, events: Sequence[QueryEvent], times: list[float],
               clock: SimClock, gap_s: float) -> None:
    """The log once more, ending one mean gap before the start: what the policy knew."""
    end = (times[-1] if times else 0.0) + gap_s
    for event, at in zip(events, times, strict=True):
        clock.now = at - end
        prompt = rag.prompt(event)
        lane.policy.logged(rag.event(event, prompt, 0, event.ttft_ms))


def _replay(lane: Lane, rag: LogRag, event: QueryEvent, at: float, clock: SimClock) -> Outcome:
    clock.now = at
    lane.worker.expire()
    lane.policy.tick(at)
    for change, result in rag.observe(event):
        lane.policy.kb_change(change, result)  # type: ignore[arg-type]
    prompt = rag.prompt(event)
    served = lane.worker.serve(prompt.token_ids, rag.tenant, event.chunk_refs)
    cached = served.result.cached_tokens
    ttft_ms = served.ttft_s * 1000
    lane.policy.served(rag.event(event, prompt, cached, ttft_ms))
    return Outcome(event, cached, warm_hit(cached, event.prefix_tokens, rag.block_size), ttft_ms)


def summary(outcomes: Sequence[Outcome], cost: CostModel) -> dict[str, Any]:
    """Hit rate and estimated TTFT percentiles, beside the log's own measured ones; a figure
    with no query behind it is None."""
    est = [o.ttft_ms for o in outcomes]
    measured = [o.event.ttft_ms for o in outcomes if o.event.ttft_ms is not None]
    n = len(outcomes)

    def pct(values: list[float], q: float) -> float | None:
        return round(percentile(values, q), 1) if values else None

    return {
        "queries": n,
        "hit_rate": round(sum(o.hit for o in outcomes) / n, 4) if n else None,
        "cached_token_share": round(sum(o.cached_tokens for o in outcomes)
                                    / max(1, sum(o.event.prompt_tokens for o in outcomes)), 4)
        if n else None,
        "est_ttft_p50_ms": pct(est, 50),
        "est_ttft_p90_ms": pct(est, 90),
        "est_ttft_p99_ms": pct(est, 99),
        "logged_ttft_p50_ms": pct(measured, 50),
        "logged_ttft_p90_ms": pct(measured, 90),
        "logged_ttft_p99_ms": pct(measured, 99),
        "cost_model": {"fixed_ms": round(cost.fixed_ms, 2),
                       "per_token_ms": round(cost.per_token_ms, 4),
                       "fitted_on": cost.fitted_on},
    }
