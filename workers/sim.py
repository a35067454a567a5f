"""A worker on a simulated clock: the real `WorkerRuntime` over the torch engine or over a
model-free engine (`CostEngine`: the same cache bookkeeping, TTFT from a fitted cost model).

The benchmarks and the tests share this harness; it depends on `workers/` and `schemas/`.
`CostEngine` lets `replay --evaluate` run the benchmark's policies without a model: prefills
and request caching admit entries to the same `PrefixCache`, lookups match the same block
chains, and no prompt is computed. Its TTFT is a linear cost model (fixed cost + cost per
prompt token not served from cache) fitted by least squares to a query log's own measured
`ttft_ms`, `prompt_tokens`, `cached_tokens`.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from schemas import ChunkRef, QueryEvent, WarmupCommand, WorkerEvent
from schemas.prefix import prefix_kv_bytes
from workers.api import Limits
from workers.engines.base import PrefixEngine, Request
from workers.engines.protocol import Engine, GenerationResult, GenerationStep
from workers.kv.blend_cost import moved_layer_share
from workers.kv.cache import ChunkKey, PrefixCache, WarmupRefused
from workers.kv.chunk_kv import ChunkSpan, plan_pieces
from workers.kv.donors import DonorIndex
from workers.kv.memory import MEMORY_THRESHOLD, Budget
from workers.metrics import WorkerMetrics
from workers.runtime import WorkerRuntime
from workers.synthesis import DEFAULT_PER_MINUTE, RateLimit, SynthesisLimits


class SimEngine(Engine, Protocol):
    """What a policy's worker runs on: a full engine (the runtime drives it) whose disk tier,
    if any, it can ask about (the torch engine, or the model-free `CostEngine`)."""

    def restorable(self, hashes: list[str], have: int) -> int: ...

    def chunk_kv_available(self, prompt: Sequence[int], spans: Sequence[ChunkSpan], *,
                           tenant: str, cached: int) -> tuple[int, int]: ...


class _Events:
    """The worker's event sink: kept in memory for the policy's bookkeeping."""

    def __init__(self) -> None:
        self.pending: list[WorkerEvent] = []

    def send(self, event: WorkerEvent) -> None:
        self.pending.append(event)

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class SimAnswer:
    """One answered query on this worker: the engine's result, the entry used, and the TTFT
    reported for it (the median of its runs; always one the engine measured)."""

    result: GenerationResult
    entry_refs: frozenset[ChunkKey]
    ttft_s: float
    restored: bool = False  # part of its prefix was read back from the disk tier
    # (chunk tokens past the exact prefix that stored prompts held, all of them) on arrival
    chunk_kv: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Measured:
    """One measurement of a query: its deployed result and its lower-median TTFT."""

    cached: int
    result: GenerationResult
    ttft_s: float


class Measurements(dict[int, Measured]):
    """The measurements made for one query, by number of cached tokens (the prompt is the
    same for every policy): a request that is the same computation reuses one."""

    def __init__(self) -> None:
        super().__init__()
        self.reused = 0

    def record(self, cached: int, result: GenerationResult, ttft_s: float) -> None:
        self.setdefault(cached, Measured(cached, result, ttft_s))


class MeasurementMemo:
    """Measurements by prompt. Per query (the default) a request shares only with the other
    policies' requests for that query; run-wide (`across_queries`) it also reuses an earlier
    query's measurement of the same computation (same prompt ids, same cached tokens): a
    repeated prompt is measured once per number of cached tokens, not once per ask."""

    def __init__(self, *, across_queries: bool = False) -> None:
        self.across_queries = across_queries
        self._by_prompt: dict[tuple[int, ...], Measurements] = {}

    def for_query(self, token_ids: Sequence[int]) -> Measurements:
        if not self.across_queries:
            return Measurements()
        return self._by_prompt.setdefault(tuple(token_ids), Measurements())


class SimWorker:
    """A worker as deployed (runtime, commands, reactive caching), on the simulated clock."""

    def __init__(
        self,
        engine: SimEngine,
        clock: Callable[[], float],
        *,
        worker_id: str,
        cache_requests: bool,
        ttft_runs: int = 1,
        chunk_reuse: bool = False,
    ) -> None:
        # Blending held chunk KV: its answers are another computation than any exact one.
        self.chunk_reuse = chunk_reuse
        self.ttft_runs = ttft_runs
        self.clock = clock
        self.worker_id = worker_id
        self.cache_requests = cache_requests
        self._boot(engine)
        self.refs: dict[str, frozenset[ChunkKey]] = {}
        # Who reads this worker's `worker.events` (the streams policies' pipelines).
        self.listeners: list[Callable[[WorkerEvent], None]] = []
        self.warm_seconds = 0.0
        self.outcomes: Counter[str] = Counter()
        self.reruns = 0  # deployed runs whose TTFT was not needed (a shared measurement)
        self.restarts = 0
        self.restore_runs = 0  # requests read back from the disk tier: run once, not shared
        self.own_measurements = 0  # measurements never shared (a blending worker's)
        self._chunk_kv = (0, 0)  # what the request being served found held (`SimAnswer`)
        self._drain()

    def _boot(self, engine: SimEngine) -> None:
        self.engine = engine
        self.sink = _Events()
        # The runtime refuses a prefill once pinned memory passes the 0.7 threshold.
        self.runtime = WorkerRuntime(
            engine, worker_id=self.worker_id, url=f"sim://{self.worker_id}", sink=self.sink,
            metrics=WorkerMetrics(worker_id=self.worker_id, model_name=engine.model_id),
            limits=Limits(1 << 15, 1, 1 << 15, 1 << 20), cache_requests=self.cache_requests,
            warmup_threshold=MEMORY_THRESHOLD,
            # Synthetic warmup's rate limit runs on the simulated clock, as the policies do.
            synthesis=SynthesisLimits(RateLimit(DEFAULT_PER_MINUTE), clock=self.clock),
        )

    def restart(self, engine: SimEngine) -> None:
        """The worker process died (nothing flushed) and booted again on `engine`: an empty
        device cache, a new runtime and epoch; a disk tier it kept was scanned by whoever
        opened `engine`. Its listeners and counters stay: they belong to the benchmark."""
        self._boot(engine)
        self.restarts += 1
        self._drain()

    @property
    def cache(self) -> PrefixCache:
        return self.engine.cache

    def serve(self, token_ids: Sequence[int], tenant: str, refs: Sequence[ChunkRef],
              shared: Measurements | None = None, spans: Sequence[ChunkSpan] = ()) -> SimAnswer:
        """Answer with one token (TTFT measured by the engine); with request caching the
        engine also stores the prompt's blocks from the request's own KV.

        The request runs `ttft_runs` times on the same cache state: trials first, which store
        and touch nothing (`PrefixCache.touching` off), then the request as deployed. Its
        TTFT is the lower median of the runs. A request that is the same computation as one
        another policy's worker measured for this query (same prompt ids, same cached
        tokens) reuses that measurement: it runs once, as deployed, for its effect on this
        cache (not at all when it has none), and no trial runs. A worker that blends chunk
        KV (`spans`: where the chunks stand) shares no measurement of a request some of whose
        chunk KV is held. A request that reads blocks back from a disk tier runs once, as
        deployed, and shares nothing.
        """
        keys = [(r.chunk_id, r.content_hash) for r in refs]
        # Spans go with every request, as the RAG client sends them: the worker donates the
        # chunks of what it stores whether it blends or not (`chunk_reuse` says that).
        spans = tuple(spans)
        cached, restoring = self._expected(token_ids, tenant)
        self._chunk_kv = self.engine.chunk_kv_available(token_ids, spans, tenant=tenant,
                                                        cached=cached)
        if restoring:
            # A read from the disk tier moves the blocks onto the device, so a trial would
            # change what the next run finds: the request runs once, as deployed.
            marks = self._tier_marks(token_ids, tenant)
            result = self._deployed(token_ids, tenant, keys, None, spans)
            self.restore_runs += 1
            return self._served(result, result.ttft_s, restored=marks)
        if self.chunk_reuse and self._chunk_kv[0]:
            # It may blend (some chunk KV is held): another computation than any exact one.
            shared = None
            self.own_measurements += 1
        known = shared.get(cached) if shared is not None else None
        if shared is not None and known is not None:
            result = self._deployed(token_ids, tenant, keys, known, spans)
            if result.cached_tokens == cached:  # the prediction held: same computation
                shared.reused += 1
                return self._served(result, known.ttft_s)
            # Never seen so far (peek matches as the engine's lookup does): the run already
            # changed this cache, so its one timing is all this request gets.
            self.reruns -= 1
            shared.record(result.cached_tokens, result, result.ttft_s)
            return self._served(result, result.ttft_s)
        trials = [self._trial_ttft(token_ids, tenant, spans) for _ in range(self.ttft_runs - 1)]
        result = self._deployed(token_ids, tenant, keys, None, spans)
        ttft = statistics.median_low([*trials, result.ttft_s])
        if shared is not None:
            shared.record(result.cached_tokens, result, ttft)
        return self._served(result, ttft)

    def expected_cached(self, token_ids: Sequence[int], tenant: str) -> int:
        """Prompt tokens the engine will take from the cache (device or disk tier), as far
        as the bookkeeping tells (peek: touches nothing); `serve` checks it against what
        the engine did."""
        return self._expected(token_ids, tenant)[0]

    def _expected(self, token_ids: Sequence[int], tenant: str) -> tuple[int, bool]:
        """`expected_cached`, and whether some of it comes back from the disk tier."""
        hashes = self.engine.block_hashes(token_ids, tenant=tenant)
        entry, matched = self.cache.peek(hashes)
        matched = matched if entry is not None else 0
        restored = self.engine.restorable(hashes, matched)
        blocks = matched + restored
        return min(blocks * self.engine.block_size, max(0, len(token_ids) - 1)), restored > 0

    def _deployed(self, token_ids: Sequence[int], tenant: str, keys: list[ChunkKey],
                  known: Measured | None, spans: Sequence[ChunkSpan] = ()) -> GenerationResult:
        """The request as deployed; skipped when a measurement exists and running it would
        change nothing here (no request caching, nothing cached to touch)."""
        if known is not None and not self.runtime.cache_requests and known.cached == 0:
            return replace(known.result, prefix_hash=None, stored=None)
        result = self.runtime.generate(
            token_ids, tenant=tenant, max_tokens=1, temperature=0.0,
            arrived=time.perf_counter(), emit=lambda step: True, chunk_refs=keys, chunks=spans,
            chunk_reuse=self.chunk_reuse,
        )
        if result is None:
            raise RuntimeError("the runtime stopped a generation nobody cancelled")
        if known is not None:
            self.reruns += 1
        return result

    def _served(self, result: GenerationResult, ttft_s: float, *,
                restored: frozenset[ChunkKey] | None = None) -> SimAnswer:
        used = self.refs.get(result.prefix_hash or "", frozenset())
        self._drain()
        if restored is None:
            return SimAnswer(result, used, ttft_s, chunk_kv=self._chunk_kv)
        # Blocks read back carry their chunk marks; the freshness check sees those too.
        return SimAnswer(result, used | restored, ttft_s, restored=True, chunk_kv=self._chunk_kv)

    def _tier_marks(self, token_ids: Sequence[int], tenant: str) -> frozenset[ChunkKey]:
        """The chunks the disk tier's blocks of this prompt pass through."""
        tier = getattr(self.engine, "tier", None)
        if tier is None:
            return frozenset()
        held = (tier.index.get(h) for h in self.engine.block_hashes(token_ids, tenant=tenant))
        return frozenset().union(*(b.marks for b in held if b is not None))

    def _trial_ttft(self, token_ids: Sequence[int], tenant: str,
                    spans: Sequence[ChunkSpan] = ()) -> float:
        # A trial stores and touches nothing: the request that follows is the one use. With
        # touching trials an entry counted `ttft_runs` hits for a request in the lane that
        # measured it and one for the same request in a lane that reused the measurement, so
        # a frequency-counting eviction (lfu-aged, gdsf) depended on which policies ran.
        self.cache.touching = False
        try:
            for step in self.engine.generate(token_ids, max_tokens=1, tenant=tenant,
                                             chunks=spans, chunk_reuse=self.chunk_reuse):
                if step.result is not None:
                    return step.result.ttft_s
        finally:
            self.cache.touching = True
        raise RuntimeError("the engine returned no result")

    def apply(self, command: WarmupCommand) -> str:
        """Carry out a warmup command as the worker does; prefill time is warmup time."""
        started = time.perf_counter()
        outcome = self.runtime.apply(command)
        if command.op in ("prefill", "prefill_chunk", "synthesize"):  # sampling is warmup too
            self.warm_seconds += time.perf_counter() - started
        self.outcomes[f"{command.op}:{outcome}"] += 1
        self._drain()
        return outcome

    def expire(self) -> None:
        self.runtime.tick()
        self._drain()

    def _drain(self) -> None:
        events, self.sink.pending = self.sink.pending, []
        for event in events:
            for listener in self.listeners:
                listener(event)
            # A block read back from the disk tier is stored without refs: the same hash
            # holds the same tokens, so the refs known for it still hold.
            if event.kind == "stored" and event.prefix_hash and (
                event.chunk_refs or event.prefix_hash not in self.refs
            ):
                self.refs[event.prefix_hash] = frozenset(
                    (r.chunk_id, r.content_hash) for r in event.chunk_refs
                )


def make_cache(budget: Budget, clock: Callable[[], float], block_size: int,
               policy: str = "lru") -> PrefixCache:
    """A prefix cache on the simulated clock, evicting by `policy` (the policy's worker:
    `Policy.eviction`); entries live until evicted unless a TTL is given (request caching,
    like vLLM's, has no TTL)."""
    return PrefixCache(budget, policy=policy, clock=clock, default_ttl_s=None,
                       block_size=block_size)


# Fallback cost model: SmolLM2-135M, torch engine, 1 thread on a shared 2-core CPU, fitted
# to the 504 rows of run B of `ragwarm bench strategies --quick` (docs/lab/benchmarks-notebook.md).
DEFAULT_COST = (127.0, 3.14)  # (ms fixed, ms per uncached prompt token)


# A moved token's cost in a blend, as a share of a computed token's: the layers the default
# selection runs it through (hkvd checked at layers 1, 4, 10 keeping 2x, 1.41x, 1x the share
# of 0.3, SmolLM2-135M's 30 layers: `moved_layer_share` = 0.378). It predicts a blend of
# Argo CD's prompts (p50 582 tokens, ~87% moved) at 46% of the full prefill; `bench blend`
# measured 40% (docs/lab/benchmarks-notebook.md, 2026-11-30), so it errs on the slow side.
DEFAULT_MOVED_SHARE = moved_layer_share(0.3, (1, 4, 10), 2.0, 30)


@dataclass(frozen=True)
class CostModel:
    """TTFT ≈ fixed_ms + per_token_ms × (prompt tokens − cached tokens); a blend computes
    the tokens no chunk KV covers and pays `moved_share` of a token for each moved one."""

    fixed_ms: float
    per_token_ms: float
    fitted_on: int = 0  # measured queries behind the fit (0: the default figures)
    moved_share: float = DEFAULT_MOVED_SHARE

    def ttft_ms(self, prompt_tokens: int, cached_tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * max(0, prompt_tokens - cached_tokens)

    def blend_ttft_ms(self, prompt_tokens: int, cached_tokens: int, moved: int) -> float:
        uncovered = max(0, prompt_tokens - cached_tokens - moved)
        return self.fixed_ms + self.per_token_ms * (uncovered + self.moved_share * moved)


def fit_cost(events: Iterable[QueryEvent]) -> CostModel:
    """Least-squares line of measured TTFT against uncached prompt tokens; the default
    figures when the log has fewer than two distinct uncached sizes."""
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


class CostEngine(PrefixEngine[int]):
    """An engine that holds only each entry's size and answers in estimated time."""

    # No model: no device, no vocabulary beyond the one token it answers with, no context
    # limit of its own (`Limits` bound the prompts, as for every engine).
    device = "none (cost model)"
    vocab_size = 1
    max_model_len = 1 << 30

    def __init__(self, cost: CostModel, cache: PrefixCache, *, model_id: str,
                 kv_bytes_per_token: int) -> None:
        self.cost = cost
        self.cache = cache
        self.model_id = model_id
        self.block_size = cache.block_size
        self.kv_bytes_per_token = kv_bytes_per_token
        self.tokenizer = None
        self._held: dict[str, int] = {}
        # The same donation bookkeeping as the torch engine: a blend's cost needs no tensors.
        self.donors = DonorIndex(self.block_size)

    def _held_bytes(self, held: int) -> int:
        return held

    def _prefix_kv(self, tokens: list[int], hashes: list[str], tenant: str) -> tuple[int, int]:
        # Blocks are shared: whatever chain is cached is reused, whoever stored it.
        _, matched = self.cache.peek(hashes)
        nbytes = prefix_kv_bytes(len(tokens), self.kv_bytes_per_token, self.block_size)
        return nbytes, len(tokens) - matched * self.block_size

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        start = time.perf_counter()
        prompt = request.prompt
        hashes = self.block_hashes(prompt, tenant=request.tenant)
        entry, matched = self._lookup(hashes)
        cached = min(matched * self.block_size, len(prompt) - 1)
        self._donate(request.tenant, prompt, request.chunks, hashes[:matched])  # as torch does
        stored = None
        keep = request.keep
        ttft_ms, moved = self._ttft_ms(request, cached)
        ttft = ttft_ms / 1000.0
        if keep is not None and hashes and matched < len(hashes) and not moved:
            n_tokens = len(hashes) * self.block_size
            nbytes = prefix_kv_bytes(n_tokens, self.kv_bytes_per_token, self.block_size)
            try:
                spans = request.chunks
                admitted, evicted = self.cache.admit(
                    tenant=request.tenant, hashes=hashes,
                    nbytes=nbytes, chunk_refs=[*keep.chunk_refs, *(s.ref for s in spans)],
                    ttl_s=keep.ttl_s, kind="request",
                    chunk_starts={s.ref: s.start for s in spans},
                )
                stored = self._record(admitted, nbytes, evicted,
                                      n_tokens - cached, start)
                self._donate(request.tenant, prompt, spans, hashes)
            except WarmupRefused:
                stored = None  # the answer matters more than caching its prompt
        result = GenerationResult(
            token_ids=(0,), text="", prompt_tokens=len(prompt), cached_tokens=cached,
            prefix_hash=entry.prefix_hash if entry else None, ttft_s=ttft, total_s=ttft,
            finish_reason="length", stored=stored, blended_tokens=moved,
        )
        yield GenerationStep(0, 0, "", result)

    def _ttft_ms(self, request: Request, cached: int) -> tuple[float, int]:
        """The request's TTFT and the tokens it blends: as the torch engine decides, a blend
        only where it is estimated faster than the cold prefill (here the estimate is the
        cost model itself, so it is exact)."""
        cold = self.cost.ttft_ms(len(request.prompt), cached)
        if not request.chunk_reuse or not request.chunks:
            return cold, 0
        donors = self.chunk_donors(request.tenant, request.prompt, request.chunks, cached)
        plans = plan_pieces(request.chunks, cached, {r: d.held for r, d in donors.items()})
        moved = sum(plan.count for plan in plans)
        blended = self.cost.blend_ttft_ms(len(request.prompt), cached, moved)
        return (blended, moved) if moved and blended < cold else (cold, 0)
