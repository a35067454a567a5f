"""What-if replay of a logged query stream against a warmup policy, without a model (pure).

Cache decisions use the worker's `PrefixCache` bookkeeping and the streams app's hot-set
decisions on the block hashes the queries logged; no prompt is recomputed. TTFT is
estimated with a linear cost model (fixed cost + cost per prompt token not served from
cache) fitted by least squares to the log's own measured `ttft_ms`, `prompt_tokens` and
`cached_tokens`; a log without two distinct measured points uses `DEFAULT_COST`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas import QueryEvent
from streams import logic
from streams.hot import HotPayload, HotTracker
from workers.blocks import BLOCK_SIZE
from workers.cache import PrefixCache, WarmupRefused
from workers.memory import DEFAULT_MAX_ENTRIES, Budget

# Fallback cost model: SmolLM2-135M, torch engine, 1 thread on a shared 2-core CPU, fitted
# to the 504 rows of run B of `ragwarm bench strategies --quick` (docs/benchmarks.md).
DEFAULT_COST = (127.0, 3.14)  # (ms fixed, ms per uncached prompt token)
# The streams app's hot-set re-plan period and the scheduled policy's timer (bench defaults).
HOT_TICK_S = 30.0
SCHEDULED_PERIOD_S = 900.0
OFFLINE_POLICIES = ("none", "reactive", "scheduled", "history", "event-rag", "hot-tokens",
                    "hybrid")


@dataclass(frozen=True)
class CostModel:
    """TTFT ≈ fixed_ms + per_token_ms × (prompt tokens − cached tokens)."""

    fixed_ms: float
    per_token_ms: float
    fitted_on: int = 0  # measured queries behind the fit (0: the default figures)

    def ttft_ms(self, prompt_tokens: int, cached_tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * max(0, prompt_tokens - cached_tokens)


def fit_cost(events: Iterable[QueryEvent]) -> CostModel:
    """Least-squares line of measured TTFT against uncached prompt tokens."""
    points = [(e.prompt_tokens - e.cached_tokens, e.ttft_ms) for e in events
              if e.ttft_ms is not None and e.prompt_tokens > 0]
    xs = [float(x) for x, _ in points]
    if len(set(xs)) < 2:
        return CostModel(*DEFAULT_COST)
    n, mx = len(points), sum(xs) / len(points)
    my = sum(float(y) for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (float(y) - my) for x, (_, y) in zip(xs, points, strict=True)) / sxx
    slope = max(slope, 0.0)
    return CostModel(max(my - slope * mx, 0.0), slope, n)


@dataclass
class Outcome:
    """One replayed query: what the policy would have served from cache, and its estimate."""

    event: QueryEvent
    cached_tokens: int
    hit: bool
    ttft_ms: float


@dataclass
class OfflinePolicy:
    """A policy's cache decisions over logged queries, on the logged block hashes."""

    name: str
    cache: PrefixCache
    bytes_per_token: int
    hot_share: float = 0.18
    ttl_s: float = 3600.0
    tracker: HotTracker = field(default_factory=HotTracker)
    questions: dict[str, tuple[str, frozenset[tuple[str, str]]]] = field(default_factory=dict)
    warm_set: list[QueryEvent] = field(default_factory=list)
    last: dict[str, QueryEvent] = field(default_factory=dict)  # newest query per prefix
    next_refresh: float = 0.0
    next_hot: float = 0.0

    @property
    def reactive(self) -> bool:
        return self.name in ("reactive", "scheduled", "history", "hot-tokens")

    def serve(self, event: QueryEvent, now: float) -> int:
        """Cached tokens this query would get, then the policy's reaction to it."""
        if self.name == "none":
            return 0
        self.before(event, now)
        chain = chain_of(event)
        _, matched = self.cache.lookup(chain, now=now)
        cached = min(matched * BLOCK_SIZE, max(event.prompt_tokens - 1, 0))
        self.after(event, now)
        return cached

    def before(self, event: QueryEvent, now: float) -> None:
        if self.name == "scheduled" and now >= self.next_refresh:
            for warm in self.warm_set:
                self.admit(prefix_chain(warm), pin=True, ttl=None)
            self.next_refresh = now + SCHEDULED_PERIOD_S
        if self.name in ("event-rag", "hybrid"):
            self.rewarm_if_changed(event)

    def after(self, event: QueryEvent, now: float) -> None:
        if self.reactive:
            self.admit(chain_of(event), pin=False, ttl=None)
        if self.name in ("event-rag", "hybrid"):
            self.admit(prefix_chain(event), pin=False, ttl=self.ttl_s)
            self.questions[event.question] = (event.prefix_hash or "", refs_of(event))
        if self.name in ("hot-tokens", "hybrid"):
            self.tracker.observe(event.prefix_hash, HotPayload(
                event.tenant, event.question, tuple(event.chunk_refs), event.prefix_tokens), now)
            if now >= self.next_hot:
                self.plan_hot(now)
                self.next_hot = now + HOT_TICK_S

    def rewarm_if_changed(self, event: QueryEvent) -> None:
        """event-rag saw the KB change before this query: the question's old prefix was
        invalidated and its new top-3 prefix prefilled (the log shows the new chunk hashes)."""
        known = self.questions.get(event.question)
        if known is None or known[0] == event.prefix_hash:
            return
        mine = {c: h for c, h in refs_of(event)}
        if any(c in mine and mine[c] != h for c, h in known[1]):
            self.cache.invalidate(known[1])
            self.admit(prefix_chain(event), pin=False, ttl=self.ttl_s)

    def plan_hot(self, now: float) -> None:
        """The streams app's hot-set decision; hot prefixes are pinned, cooled ones released."""
        ranked = self.tracker.ranked(now)
        budget = int(self.hot_share * self.cache.budget.max_bytes)
        candidates = [logic.HotCandidate(h, c, p.prefix_tokens) for h, c, p in ranked]
        hot, cooled = logic.plan_hot_set(candidates, budget, self.bytes_per_token,
                                         self.tracker.hot)
        events = {h: p for h, _, p in ranked}
        for prefix_hash in hot:
            if prefix_hash not in self.tracker.hot and prefix_hash in self.last:
                self.tracker.hot[prefix_hash] = events[prefix_hash]
                self.admit(prefix_chain(self.last[prefix_hash]), pin=True, ttl=None)
        for prefix_hash in cooled:
            self.tracker.hot.pop(prefix_hash, None)
            if prefix_hash in self.cache:
                self.cache.release(prefix_hash)

    def admit(self, chain: Sequence[str], *, pin: bool, ttl: float | None) -> None:
        if not chain:
            return
        nbytes = len(chain) * BLOCK_SIZE * self.bytes_per_token
        try:
            self.cache.admit(tenant="offline", hashes=chain, nbytes=nbytes, pin=pin, ttl_s=ttl)
        except WarmupRefused:
            return


def chain_of(event: QueryEvent) -> list[str]:
    """The prompt's block chain as logged; a log without it stands for the prefix alone."""
    return list(event.block_hashes) or prefix_chain(event)


def prefix_chain(event: QueryEvent) -> list[str]:
    blocks = event.prefix_tokens // BLOCK_SIZE
    if event.block_hashes and blocks:
        return list(event.block_hashes[:blocks])
    return [event.prefix_hash] if event.prefix_hash else []


def refs_of(event: QueryEvent) -> frozenset[tuple[str, str]]:
    return frozenset((r.chunk_id, r.content_hash) for r in event.chunk_refs)


def evaluate(
    events: Sequence[QueryEvent],
    policy: str,
    kv_bytes: int,
    bytes_per_token: int,
    cost: CostModel | None = None,
) -> tuple[list[Outcome], CostModel]:
    """Replay `events` (in timestamp order) against `policy` with a KV budget of `kv_bytes`."""
    if policy not in OFFLINE_POLICIES:
        valid = ", ".join(OFFLINE_POLICIES)
        raise ValueError(f"unknown warmup policy {policy!r}; valid names: {valid}")
    ordered = sorted(events, key=lambda e: e.timestamp)
    cost = cost or fit_cost(ordered)
    t0 = ordered[0].timestamp.timestamp() if ordered else 0.0
    clock = {"now": 0.0}
    cache = PrefixCache(Budget(kv_bytes, DEFAULT_MAX_ENTRIES, kv_bytes), policy="lru",
                        clock=lambda: clock["now"], default_ttl_s=None)
    sim = OfflinePolicy(policy, cache, bytes_per_token)
    sim.warm_set = _warm_set(ordered, kv_bytes, bytes_per_token, policy)
    if policy == "history":
        for warm in sim.warm_set:
            sim.admit(prefix_chain(warm), pin=False, ttl=None)
    out = []
    for event in ordered:
        clock["now"] = event.timestamp.timestamp() - t0
        if event.prefix_hash:
            sim.last[event.prefix_hash] = event
        cached = sim.serve(event, clock["now"])
        aligned = event.prefix_tokens // BLOCK_SIZE * BLOCK_SIZE
        out.append(Outcome(event, cached, aligned > 0 and cached >= aligned,
                           cost.ttft_ms(event.prompt_tokens, cached)))
    return out, cost


def _warm_set(events: Sequence[QueryEvent], kv_bytes: int, bytes_per_token: int,
              policy: str) -> list[QueryEvent]:
    """The log's most asked prefixes within the policy's share (the log stands for history)."""
    share = {"history": 1.0, "scheduled": 0.18}.get(policy, 0.0)
    counts: dict[str, int] = {}
    last: dict[str, QueryEvent] = {}
    for e in events:
        if e.prefix_hash:
            counts[e.prefix_hash] = counts.get(e.prefix_hash, 0) + 1
            last[e.prefix_hash] = e
    picked, used = [], 0
    for prefix_hash in sorted(counts, key=lambda h: -counts[h]):
        size = last[prefix_hash].prefix_tokens // BLOCK_SIZE * BLOCK_SIZE * bytes_per_token
        if used + size <= share * kv_bytes:
            picked.append(last[prefix_hash])
            used += size
    return picked


def summary(outcomes: Sequence[Outcome], cost: CostModel) -> dict[str, Any]:
    """Hit rate and estimated TTFT percentiles, beside the log's own measured ones."""
    from ragwarm.bench.strategies.metrics import percentile

    est = [o.ttft_ms for o in outcomes]
    measured = [o.event.ttft_ms for o in outcomes if o.event.ttft_ms is not None]
    n = len(outcomes)
    return {
        "queries": n,
        "hit_rate": round(sum(o.hit for o in outcomes) / n, 4) if n else 0.0,
        "cached_token_share": round(sum(o.cached_tokens for o in outcomes)
                                    / max(1, sum(o.event.prompt_tokens for o in outcomes)), 4),
        "est_ttft_p50_ms": round(percentile(est, 50), 1) if est else None,
        "est_ttft_p99_ms": round(percentile(est, 99), 1) if est else None,
        "logged_ttft_p50_ms": round(percentile(measured, 50), 1) if measured else None,
        "logged_ttft_p99_ms": round(percentile(measured, 99), 1) if measured else None,
        "cost_model": {"fixed_ms": round(cost.fixed_ms, 2),
                       "per_token_ms": round(cost.per_token_ms, 4),
                       "fitted_on": cost.fitted_on},
    }
