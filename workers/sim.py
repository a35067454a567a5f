"""A worker on a simulated clock: the real `WorkerRuntime` over the torch engine or over the
model-free engine (`workers.cost_engine.CostEngine`: the same cache bookkeeping, TTFT from a
fitted cost model), charged simulated time for its warmups.

The benchmarks and the tests share this harness; it depends on `workers/` and `schemas/`.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from schemas import ChunkRef, WarmupCommand, WorkerEvent
from workers.api import Limits
from workers.cost_engine import CostModel
from workers.engines.protocol import Engine, GenerateRequest, GenerationResult
from workers.kv.budgets import CPU_CHUNK, chunk_spans
from workers.kv.cache import ChunkKey, PrefixCache
from workers.kv.chunk_kv import ChunkSpan
from workers.kv.memory import MEMORY_THRESHOLD
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
    queued_s: float = 0.0  # of `ttft_s`, the wait behind the worker's warmup prefills
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
        # A worker that prefills is not serving: each warmup occupies it for its compute
        # time on the simulated clock, back to back (`occupy`); see `_wait`.
        self.jobs: deque[list[float]] = deque()  # [start, end, pass seconds] of each warmup
        # A warmup gives the engine up between passes of this many tokens (`_wait`).
        self.pass_tokens = int(getattr(engine, "prefill_chunk_tokens", 0) or CPU_CHUNK)
        self.busy_seconds = 0.0  # simulated seconds of warmup compute charged
        self.queued_seconds = 0.0  # simulated seconds requests waited behind it
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
            marks = self._tier_marks(token_ids, tenant, spans, cached)
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
        # The wait is this worker's own, never part of a measurement another lane reuses.
        wait = self._wait(result.ttft_s)
        if restored is None:
            return SimAnswer(result, used, ttft_s + wait, queued_s=wait, chunk_kv=self._chunk_kv)
        # Blocks read back carry their chunk marks; the freshness check sees those too.
        return SimAnswer(result, used | restored, ttft_s + wait, restored=True, queued_s=wait,
                         chunk_kv=self._chunk_kv)

    def _tier_marks(self, token_ids: Sequence[int], tenant: str, spans: Sequence[ChunkSpan],
                    cached: int) -> frozenset[ChunkKey]:
        """The versions of each chunk the tier's blocks say the KV read for it holds: the
        marks of the block with the chunk's last cached token. Not of every block: the block
        with a chunk's first tokens is shared with the chunk's other versions (and other
        chunks) that open the same way, and stays when one of them changes."""
        tier = getattr(self.engine, "tier", None)
        if tier is None:
            return frozenset()
        hashes = self.engine.block_hashes(token_ids, tenant=tenant)
        size = self.engine.block_size
        marks: set[ChunkKey] = set()
        for span in spans:
            last = min(span.end, cached) - 1
            held = tier.index.get(hashes[last // size]) if span.start <= last else None
            marks |= {r for r in held.marks if r[0] == span.ref[0]} if held is not None else set()
        return frozenset(marks)

    def _trial_ttft(self, token_ids: Sequence[int], tenant: str,
                    spans: Sequence[ChunkSpan] = ()) -> float:
        # A trial stores and touches nothing: the request that follows is the one use. With
        # touching trials an entry counted `ttft_runs` hits for a request in the lane that
        # measured it and one for the same request in a lane that reused the measurement, so
        # a frequency-counting eviction (lfu-aged, gdsf) depended on which policies ran.
        self.cache.touching = False
        try:
            request = GenerateRequest(token_ids, max_tokens=1, tenant=tenant, chunks=spans,
                                      chunk_reuse=self.chunk_reuse)
            for step in self.engine.generate(request):
                if step.result is not None:
                    return step.result.ttft_s
        finally:
            self.cache.touching = True
        raise RuntimeError("the engine returned no result")

    def apply(self, command: WarmupCommand) -> str:
        """Carry out a warmup command as the worker does; prefill time is warmup time, and
        the worker is busy for it on the simulated clock (`occupy`)."""
        warmup = command.op in ("prefill", "prefill_chunk", "synthesize")  # sampling too
        tokens = [*getattr(command, "opening_ids", ()), *command.token_ids]
        cached = self.expected_cached(tokens, command.tenant) if warmup and tokens else 0
        started = time.perf_counter()
        outcome = self.runtime.apply(command)
        if warmup:
            spent = time.perf_counter() - started
            if outcome == "stored" or command.op == "synthesize":
                # Sampling runs as one turn; a prefill in the engine's passes over its
                # uncached tokens.
                passes = 1 if command.op == "synthesize" else len(
                    chunk_spans(len(tokens) - cached, self.pass_tokens))
                compute_s = self._compute_s(len(tokens), cached, spent)
                self.occupy(compute_s, passes)
            else:  # skipped (already cached, stale): the cost engine computed nothing
                compute_s = 0.0 if self._cost_model() else spent
            # Warmup time on the clock the requests see: the cost model's, not the time
            # the cost engine's bookkeeping took (that varied between identical runs).
            self.warm_seconds += compute_s
        self.outcomes[f"{command.op}:{outcome}"] += 1
        self._drain()
        return outcome

    @property
    def busy_until(self) -> float:
        """When the queued warmup ends (simulated seconds; -inf when none is queued)."""
        return self.jobs[-1][1] if self.jobs else float("-inf")

    def occupy(self, seconds: float, passes: int = 1) -> None:
        """Queue `seconds` of warmup compute, in `passes` equal forward passes, after what
        the worker has queued."""
        start = max(self.busy_until, self.clock())
        self.jobs.append([start, start + seconds, seconds / max(1, passes)])
        self.busy_seconds += seconds

    def idle(self) -> None:
        """Forget queued warmup: what a worker does before it takes traffic costs none."""
        self.jobs.clear()

    def _wait(self, compute_s: float) -> float:
        """How long a request arriving now waits, as the worker's engine lock schedules it
        (requests first, `workers.engine_lock`): for the rest of the forward pass under way
        (a warmup prefill yields between passes of `pass_tokens`, as the torch engine does),
        not for the passes after it nor the prefills queued behind it, which resume after
        the request's `compute_s`."""
        now = self.clock()
        while self.jobs and self.jobs[0][1] <= now:
            self.jobs.popleft()
        wait = 0.0
        if self.jobs and self.jobs[0][0] <= now:
            start, end, pass_s = self.jobs[0]
            done = start + pass_s * (1 + int((now - start) // pass_s))  # this pass's end
            wait = min(end, done) - now
            if done < end:  # the rest of the prefill, from the next pass on, waits too
                self.jobs[0] = [start, done, pass_s]
                self.jobs.insert(1, [done, end, pass_s])
        for job in self.jobs:
            if job[0] > now:  # not started: runs after the request
                job[0] += compute_s
                job[1] += compute_s
        self.queued_seconds += wait
        return wait

    def _cost_model(self) -> CostModel | None:
        """The cost engine's model (its times come from it); None for a real engine."""
        cost = getattr(self.engine, "cost", None)
        return cost if isinstance(cost, CostModel) else None

    def _compute_s(self, prompt_tokens: int, cached: int, measured_s: float) -> float:
        # The cost engine's own estimate (it computes nothing); a real engine's wall time.
        cost = self._cost_model()
        return measured_s if cost is None else cost.ttft_ms(prompt_tokens, cached) / 1000.0

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
