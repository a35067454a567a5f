"""Prometheus metrics of one worker, in a registry of its own (no global state).

Names follow vLLM's `vllm:` metrics where vLLM has one (so its dashboards read a ragwarm
worker beside vLLM servers) and `ragwarm_worker_<name>_<unit>` elsewhere: counters end in
`_total`, durations are in seconds, sizes in bytes, and ratios are left to Prometheus (a
numerator and a denominator counter), apart from the seed's aliases in `SEED_ALIASES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# TTFT spans ~10 ms (warm, GPU) to tens of seconds (cold 4k prompt on 2 CPU cores).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 4.0, 6.0, 10.0, 20.0)
# Seed 000 asks for these four by name (design digest: "cold_start_count (per instance),
# warmup_hit_rate, first_token_latency (distribution), kv_cache_miss"), so they stay, as
# aliases of the conventional metric each repeats. They are the only names off the
# convention (no prefix, no unit, and `warmup_hit_rate` a since-start ratio in a gauge
# where the convention has Prometheus divide two counters); the names test exempts exactly
# these. Alias -> what to query instead.
SEED_ALIASES: dict[str, str] = {
    "first_token_latency": "vllm:time_to_first_token_seconds",
    "cold_start_count": "ragwarm_worker_cold_starts_total",
    "kv_cache_miss": "ragwarm_worker_kv_cache_misses_total",
    "warmup_hit_rate": "rate(ragwarm_worker_warmup_hits_total) / rate(vllm:request_success_total)",
}


@dataclass(frozen=True)
class Served:
    """What one completion cost: its prompt, what the cache saved, its first token, and
    what it generated (`generation_tokens`, and why it ended: vLLM's `finished_reason`)."""

    prompt_tokens: int
    cached_tokens: int
    full_blocks: int
    ttft_s: float
    cache_was_empty: bool
    generation_tokens: int = 0
    finish_reason: str = "stop"


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

    - `ragwarm_worker_cold_starts_total`: requests served while this worker's cache held no
      entry at all, i.e. the instance itself was cold (never warmed, or everything was
      dropped). A warmed worker keeps it at 0; without warmup it counts the first request(s)
      after start.
    - `ragwarm_worker_kv_cache_misses_total`: requests whose prompt had at least one full
      block but matched no cached prefix (a miss against whatever the cache held).
    - `ragwarm_worker_warmup_lookups_total` / `..._hits_total`: requests whose prompt had a
      full block (ones a cache could serve) / those served with cached tokens; their rate
      ratio is the hit rate.
    - `vllm:*`: what a vLLM server measures too, counted like vLLM's and labelled by
      `model_name`, so one adapter and vLLM's dashboards read both (`prefix_cache_queries`
      / `_hits` are in prompt tokens, as vLLM's are).
    """

    def __init__(self, *, worker_id: str, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._vllm_metrics(r, model_name)
        self.cold_starts = Counter(
            "ragwarm_worker_cold_starts",
            "Requests served while the cache held no entry.",
            registry=r,
        )
        self.lookups = Counter(
            "ragwarm_worker_warmup_lookups",
            "Requests with at least one full prompt block.",
            registry=r,
        )
        self.hits = Counter(
            "ragwarm_worker_warmup_hits",
            "Requests served with at least one cached prompt token.",
            registry=r,
        )
        self.misses = Counter(
            "ragwarm_worker_kv_cache_misses",
            "Requests with >= 1 full block that matched no prefix.",
            registry=r,
        )
        self._cache_gauges(r)
        self._work_metrics(r)
        self.malformed = Counter(
            "ragwarm_worker_commands_malformed",
            "Records on warmup.commands that were not valid commands (refused, dead-lettered).",
            registry=r,
        )
        self._refusal_metrics(r)
        self.synthetic_questions = Counter(
            "ragwarm_worker_synthetic_questions",
            "Questions sampled for synthetic warmup.",
            registry=r,
        )
        self.events = Counter(
            "ragwarm_worker_events_published", "Events sent.", ["kind"], registry=r
        )
        self.ready = Gauge(
            "ragwarm_worker_ready", "1 when the worker serves.", ["worker_id"], registry=r
        )
        self._worker_id = worker_id
        self.seed = SeedAliases(r)
        self._by_outcome = {
            "lookup": self.lookups,
            "hit": self.hits,
            "miss": self.misses,
            "cold": self.cold_starts,
        }

    def _vllm_metrics(self, r: CollectorRegistry, model_name: str) -> None:
        """vLLM's names for what a vLLM server measures too, with vLLM's `model_name` label."""
        model = {"model_name": model_name}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Seconds from request arrival to the first token (vLLM-compatible).",
            ["model_name"],
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(**model)
        self.requests = Counter(
            "vllm:request_success",
            "Completion requests finished, by why they ended (vLLM-compatible).",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self._model = model
        self.prompt_tokens = self._vllm_counter(
            r, "vllm:prompt_tokens", "Prompt tokens of finished requests (vLLM-compatible)."
        )
        self.generation_tokens = self._vllm_counter(
            r, "vllm:generation_tokens", "Tokens generated (vLLM-compatible)."
        )
        self.queries = self._vllm_counter(
            r,
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in prompt tokens (vLLM-compatible).",
        )
        self.token_hits = self._vllm_counter(
            r,
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in cached prompt tokens (vLLM-compatible).",
        )
        self.usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage, 1 means 100 percent (vLLM-compatible).",
            ["model_name"],
            registry=r,
        ).labels(**model)
        # Requests wait for the engine (`workers.engine_lock`), then run one at a time.
        self.running = Gauge(
            "vllm:num_requests_running",
            "Requests holding the engine (vLLM-compatible).",
            ["model_name"],
            registry=r,
        ).labels(**model)
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Requests waiting for the engine (vLLM-compatible).",
            ["model_name"],
            registry=r,
        ).labels(**model)

    def _vllm_counter(self, r: CollectorRegistry, name: str, doc: str) -> Counter:
        return Counter(name, doc, ["model_name"], registry=r).labels(**self._model)

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
        self.prefills = Counter(
            "ragwarm_worker_prefills", "Prefixes prefilled.", ["source"], registry=r
        )
        # Requests go first (`workers.engine_lock`): their wait is the pass running when they
        # came; a warmup's is every request before it.
        self.engine_wait = Histogram(
            "ragwarm_worker_engine_wait_seconds",
            "Seconds a request or a warmup prefill waited for the engine (held by other work).",
            ["work"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.commands = Counter(
            "ragwarm_worker_commands", "Warmup commands handled.", ["op", "result"], registry=r
        )
        # Under back-to-back requests background work still gets a turn after a bound wait.
        self.engine_overdue = Counter(
            "ragwarm_worker_engine_overdue_turns",
            "Background turns (a warmup pass or a command) that went ahead of waiting "
            "requests after waiting RAGWARM_WORKER_BACKGROUND_MAX_WAIT_S.",
            registry=r,
        )

    def _cache_gauges(self, r: CollectorRegistry) -> None:
        """What the KV cache holds: entries, bytes and blocks by kind."""
        self.cache_bytes = Gauge(
            "ragwarm_worker_kv_cache_usage_bytes", "KV bytes held by cache entries.", registry=r
        )
        self.cache_capacity = Gauge(
            "ragwarm_worker_kv_cache_capacity_bytes", "KV byte budget.", registry=r
        )
        self.cache_entries = Gauge(
            "ragwarm_worker_kv_cache_entries", "Cached prefixes.", registry=r
        )
        self.warm_prefixes = Gauge(
            "ragwarm_worker_kv_cache_warm_prefixes", "Pinned (warmup-owned) prefixes.", registry=r
        )
        self.blocks = Gauge(
            "ragwarm_worker_kv_cache_blocks",
            "Cached KV blocks: all, shared (held by > 1 prefix), managed (warmup), request "
            "(the worker's own request caching), pinned.",
            ["kind"],
            registry=r,
        )
        self.block_bytes = Gauge(
            "ragwarm_worker_kv_cache_block_bytes",
            "Bytes of cached KV blocks, each counted once: all, managed, request, pinned.",
            ["kind"],
            registry=r,
        )

    def observe(self, served: Served) -> None:
        """Count one completed request."""
        self.requests.labels(finished_reason=served.finish_reason, **self._model).inc()
        self.ttft.observe(served.ttft_s)
        self.prompt_tokens.inc(served.prompt_tokens)
        self.generation_tokens.inc(served.generation_tokens)
        self.queries.inc(served.prompt_tokens)
        self.token_hits.inc(served.cached_tokens)
        outcomes = classify(served)
        for outcome in outcomes:
            self._by_outcome[outcome].inc()
        self.seed.observe(served, outcomes)

    @contextmanager
    def in_flight(self) -> Iterator[Callable[[], None]]:
        """One request from arrival to answer: waiting until it calls the function it gets
        (when it takes the engine), running from then on."""
        self.waiting.inc()
        running = False

        def started() -> None:
            nonlocal running
            if not running:
                running = True
                self.waiting.dec()
                self.running.inc()

        try:
            yield started
        finally:
            (self.running if running else self.waiting).dec()

    def cache_state(self, *, used: int, capacity: int, entries: int, pinned: int) -> None:
        self.cache_bytes.set(used)
        self.cache_capacity.set(capacity)
        self.cache_entries.set(entries)
        self.warm_prefixes.set(pinned)
        self.usage.set(used / capacity if capacity else 0.0)

    def block_state(self, stats: Mapping[str, int]) -> None:
        """Block figures from `workers.kv.block_pool.PoolStats` (as a dict)."""
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


class SeedAliases:
    """Seed 000's four metrics under the seed's names (`SEED_ALIASES` says why), fed with
    the same requests as the conventional metrics they repeat."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "first_token_latency",
            "Seconds from request arrival to the first token (seed 000's name).",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.cold_starts = Counter(
            "cold_start_count",
            "Requests served while the cache held no entry (seed 000's name).",
            registry=r,
        )
        self.misses = Counter(
            "kv_cache_miss",
            "Requests with >= 1 full block that matched no prefix (seed 000's name).",
            registry=r,
        )
        self.hit_rate = Gauge(
            "warmup_hit_rate",
            "Requests with a cached prefix / all requests since start (seed 000's name).",
            registry=r,
        )
        self._requests = 0
        self._hits = 0

    def observe(self, served: Served, outcomes: frozenset[Outcome]) -> None:
        self.ttft.observe(served.ttft_s)
        if "cold" in outcomes:
            self.cold_starts.inc()
        if "miss" in outcomes:
            self.misses.inc()
        self._requests += 1
        self._hits += "hit" in outcomes
        self.hit_rate.set(self._hits / self._requests)
