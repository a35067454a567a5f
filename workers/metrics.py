"""Prometheus metrics of one worker, in a registry of its own (no global state)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# TTFT spans ~10 ms (warm, GPU) to tens of seconds (cold 4k prompt on 2 CPU cores).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 4.0, 6.0, 10.0, 20.0)


@dataclass(frozen=True)
class Served:
    """What one completion cost: its prompt, what the cache saved, and its first token."""

    prompt_tokens: int
    cached_tokens: int
    full_blocks: int
    ttft_s: float
    cache_was_empty: bool


Outcome = Literal["lookup", "hit", "miss", "cold"]


def classify(served: Served) -> frozenset[Outcome]:
    """What one request was, for every counter that counts requests (both name sets):
    `lookup` a prompt with a full block (one a cache could serve), `hit` served with cached
    tokens, `miss` a lookup that matched nothing, `cold` served while the cache was empty."""
    found: set[Outcome] = set()
    if served.full_blocks > 0:
        found.add("lookup")
    if served.cached_tokens > 0:
        found.add("hit")
    elif served.full_blocks > 0:
        found.add("miss")
    if served.cache_was_empty:
        found.add("cold")
    return frozenset(found)


class WorkerMetrics:
    """The metrics a worker exports on `/metrics`.

    - `cold_start_count`: requests served while this worker's cache held no entry at all,
      i.e. the instance itself was cold (never warmed, or everything was dropped). A
      warmed worker keeps it at 0; without warmup it counts the first request(s) after start.
    - `kv_cache_miss`: requests whose prompt had at least one full block but matched no
      cached prefix (a miss against whatever the cache held).
    - `warmup_hit_rate`: requests with >= 1 cached prompt token / all completion requests.
    - `first_token_latency`: seconds from request arrival to the first generated token.
    - `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`: prompt tokens looked up and
      prompt tokens served from cache, counted like vLLM so one adapter reads both.
    """

    def __init__(self, *, worker_id: str, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("worker_requests", "Completion requests served.", registry=r)
        self.hits = Counter("worker_prefix_hits", "Requests with >= 1 cached token.", registry=r)
        self.cold_starts = Counter(
            "cold_start_count", "Requests served while the cache held no entry.", registry=r
        )
        self.misses = Counter(
            "kv_cache_miss", "Requests with >= 1 full block that matched no prefix.", registry=r
        )
        self.hit_rate = Gauge(
            "warmup_hit_rate", "Requests with a cached prefix / all requests.", registry=r
        )
        self.ttft = Histogram(
            "first_token_latency",
            "Seconds from request arrival to the first token.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._labels = {"model_name": model_name}
        self.queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in prompt tokens (vLLM-compatible).",
            ["model_name"],
            registry=r,
        ).labels(**self._labels)
        self.token_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in cached prompt tokens (vLLM-compatible).",
            ["model_name"],
            registry=r,
        ).labels(**self._labels)
        self._cache_gauges(r)
        self._work_metrics(r)
        self.malformed = Counter(
            "worker_commands_malformed",
            "Records on warmup.commands that were not valid commands (refused, dead-lettered).",
            registry=r,
        )
        self._refusal_metrics(r)
        self.synthetic_questions = Counter(
            "worker_synthetic_questions", "Questions sampled for synthetic warmup.", registry=r
        )
        self.events = Counter("worker_events_published", "Events sent.", ["kind"], registry=r)
        self.ready = Gauge("worker_ready", "1 when the worker serves.", ["worker_id"], registry=r)
        self._worker_id = worker_id
        self.named = NamedMetrics(r, model_name)
        self._n_requests = 0
        self._n_hits = 0
        self._by_outcome = {"hit": self.hits, "miss": self.misses, "cold": self.cold_starts}

    def _refusal_metrics(self, r: CollectorRegistry) -> None:
        """Issue 41: commands refused before or after handling (unsigned, bad_signature,
        failed), and transient failures retried (an alert when it keeps rising)."""
        self.commands_refused = Counter(
            "ragwarm_worker_commands_refused",
            "Warmup commands refused and dead-lettered, by reason.", ["reason"], registry=r,
        )
        self.command_retries = Counter(
            "ragwarm_worker_command_retries",
            "Warmup commands that failed transiently and are retried from their offset.",
            registry=r,
        )

    def _work_metrics(self, r: CollectorRegistry) -> None:
        """What the engine did: prefills, commands, and what each kind of work waited."""
        self.prefills = Counter("worker_prefills", "Prefixes prefilled.", ["source"], registry=r)
        # Requests go first (`workers.engine_lock`): their wait is the pass running when they
        # came; a warmup's is every request before it.
        self.engine_wait = Histogram(
            "ragwarm_engine_wait_seconds",
            "Seconds a request or a warmup prefill waited for the engine (held by other work).",
            ["work"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.commands = Counter(
            "worker_commands", "Warmup commands handled.", ["op", "result"], registry=r
        )
        # Under back-to-back requests background work still gets a turn after a bound wait.
        self.engine_overdue = Counter(
            "ragwarm_engine_overdue_turns",
            "Background turns (a warmup pass or a command) that went ahead of waiting "
            "requests after waiting RAGWARM_WORKER_BACKGROUND_MAX_WAIT_S.",
            registry=r,
        )

    def _cache_gauges(self, r: CollectorRegistry) -> None:
        """What the KV cache holds: entries, bytes and blocks by kind."""
        self.cache_bytes = Gauge("kv_cache_bytes", "KV bytes held by cache entries.", registry=r)
        self.cache_capacity = Gauge("kv_cache_capacity_bytes", "KV byte budget.", registry=r)
        self.cache_entries = Gauge("kv_cache_entries", "Cached prefixes.", registry=r)
        self.warm_prefixes = Gauge(
            "kv_cache_warm_prefixes", "Pinned (warmup-owned) prefixes.", registry=r
        )
        self.blocks = Gauge(
            "kv_cache_blocks",
            "Cached KV blocks: all, shared (held by > 1 prefix), managed (warmup), request "
            "(the worker's own request caching), pinned.",
            ["kind"],
            registry=r,
        )
        self.block_bytes = Gauge(
            "kv_cache_block_bytes",
            "Bytes of cached KV blocks, each counted once: all, managed, request, pinned.",
            ["kind"],
            registry=r,
        )

    def observe(self, served: Served) -> None:
        """Count one completed request."""
        self.requests.inc()
        self.ttft.observe(served.ttft_s)
        self.queries.inc(served.prompt_tokens)
        self.token_hits.inc(served.cached_tokens)
        outcomes = classify(served)
        for outcome in outcomes:
            if outcome in self._by_outcome:
                self._by_outcome[outcome].inc()
        self._n_requests += 1
        self._n_hits += "hit" in outcomes
        self.hit_rate.set(self._n_hits / self._n_requests)
        self.named.observe(served, outcomes)

    def cache_state(self, *, used: int, capacity: int, entries: int, pinned: int) -> None:
        self.cache_bytes.set(used)
        self.cache_capacity.set(capacity)
        self.cache_entries.set(entries)
        self.warm_prefixes.set(pinned)
        self.named.cache_state(used, capacity, entries)

    def block_state(self, stats: Mapping[str, int]) -> None:
        """Block figures from `workers.block_pool.PoolStats` (as a dict)."""
        if not stats:
            return
        for kind, key in (
            ("all", "blocks"),
            ("shared", "shared_blocks"),
            ("managed", "managed_blocks"),
            ("request", "request_blocks"),
            ("pinned", "pinned_blocks"),
        ):
            self.blocks.labels(kind=kind).set(stats[key])
        for kind, key in (
            ("all", "bytes"),
            ("managed", "managed_bytes"),
            ("request", "request_bytes"),
            ("pinned", "pinned_bytes"),
        ):
            self.block_bytes.labels(kind=kind).set(stats[key])

    def set_ready(self, ready: bool) -> None:
        self.ready.labels(worker_id=self._worker_id).set(1 if ready else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class NamedMetrics:
    """The same figures under the names dashboards read: `ragwarm_*` with units, and vLLM's.

    `ragwarm_warmup_lookups_total` counts requests whose prompt had a full block (ones a
    cache could serve), `ragwarm_warmup_hits_total` those served with cached tokens: their
    rate ratio is the hit rate. The `vllm:` series carry a `model_name` label like vLLM's
    own, so the production-stack dashboards show a ragwarm worker beside vLLM servers.
    """

    def __init__(self, r: CollectorRegistry, model_name: str) -> None:
        model = {"model_name": model_name}
        self.ttft = Histogram("ragwarm_time_to_first_token_seconds",
                              "Seconds from request arrival to the first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.requests = Counter("ragwarm_requests_total", "Completion requests served.",
                                registry=r)
        self.cold_starts = Counter("ragwarm_cold_starts_total",
                                   "Requests served while the cache held no entry.", registry=r)
        self.lookups = Counter("ragwarm_warmup_lookups_total",
                               "Requests with at least one full prompt block.", registry=r)
        self.hits = Counter("ragwarm_warmup_hits_total",
                            "Requests served with at least one cached prompt token.", registry=r)
        self.misses = Counter("ragwarm_kv_cache_misses_total",
                              "Requests with a full block that matched no cached prefix.",
                              registry=r)
        self.prompt_tokens = Counter("ragwarm_prompt_tokens_total", "Prompt tokens received.",
                                     registry=r)
        self.cached_tokens = Counter("ragwarm_cached_prompt_tokens_total",
                                     "Prompt tokens served from the KV cache.", registry=r)
        self.usage_bytes = Gauge("ragwarm_kv_cache_usage_bytes", "KV bytes held.", registry=r)
        self.capacity_bytes = Gauge("ragwarm_kv_cache_capacity_bytes", "KV byte budget.",
                                    registry=r)
        self.entries = Gauge("ragwarm_kv_cache_entries", "Cached prefixes.", registry=r)
        self.vllm_ttft = Histogram("vllm:time_to_first_token_seconds",
                                   "Time to first token in seconds (vLLM-compatible).",
                                   ["model_name"], buckets=TTFT_BUCKETS,
                                   registry=r).labels(**model)
        self.vllm_usage = Gauge("vllm:kv_cache_usage_perc",
                                "KV-cache usage, 1 means 100 percent (vLLM-compatible).",
                                ["model_name"], registry=r).labels(**model)
        self._by_outcome = {"lookup": self.lookups, "hit": self.hits, "miss": self.misses,
                            "cold": self.cold_starts}

    def observe(self, served: Served, outcomes: frozenset[Outcome] | None = None) -> None:
        self.requests.inc()
        self.ttft.observe(served.ttft_s)
        self.vllm_ttft.observe(served.ttft_s)
        self.prompt_tokens.inc(served.prompt_tokens)
        self.cached_tokens.inc(served.cached_tokens)
        for outcome in classify(served) if outcomes is None else outcomes:
            self._by_outcome[outcome].inc()

    def cache_state(self, used: int, capacity: int, entries: int) -> None:
        self.usage_bytes.set(used)
        self.capacity_bytes.set(capacity)
        self.entries.set(entries)
        self.vllm_usage.set(used / capacity if capacity else 0.0)
