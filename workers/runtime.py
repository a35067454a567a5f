"""A running worker: one engine behind one lock (requests first), commands applied, cache
events published."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Literal, Unpack

from schemas import ChunkRef, WarmupCommand, WorkerEvent
from workers.api import ApiError, Limits, check_prompt
from workers.commands import EventSink
from workers.engine_lock import DEFAULT_BACKGROUND_MAX_WAIT_S, EngineLock
from workers.engines.protocol import (
    Engine,
    GenerateRequest,
    GenerationResult,
    GenerationStep,
    PrefillOptions,
    PrefillResult,
)
from workers.kv.cache import CacheEvent, ChunkKey, WarmupRefused
from workers.kv.chunk_kv import ChunkSpan
from workers.kv.memory import MEMORY_THRESHOLD, accepts_warmup
from workers.metrics import Served, WorkerMetrics
from workers.snapshot import EMPTY, MAX_TIER_PREFIXES, Snapshot, entry_summary
from workers.synthesis import (
    DEFAULT_PER_MINUTE,
    RateLimit,
    SynthesisLimits,
    clean_questions,
    sampling_bytes,
    within_share,
)

log = logging.getLogger(__name__)

Emit = Callable[[GenerationStep], bool]


def chunk_keys(refs: Iterable[ChunkRef]) -> list[ChunkKey]:
    return [(r.chunk_id, r.content_hash) for r in refs]


def command_spans(cmd: WarmupCommand) -> tuple[ChunkSpan, ...]:
    """A prefill command's chunk places as the engine takes them (the schema checked them)."""
    return tuple(ChunkSpan((s.chunk_id, s.content_hash), s.start, s.end) for s in cmd.chunk_spans)


class WorkerRuntime:
    """Serializes engine work (generation, prefill, commands) and reports every cache change.

    All methods block; call them from worker threads, never from the HTTP event loop.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        worker_id: str,
        url: str,
        sink: EventSink,
        metrics: WorkerMetrics,
        limits: Limits,
        cache_requests: bool = True,
        warmup_threshold: float = MEMORY_THRESHOLD,
        epoch: int | None = None,
        synthesis: SynthesisLimits | None = None,
        node: str | None = None,
        background_max_wait_s: float | None = DEFAULT_BACKGROUND_MAX_WAIT_S,
    ) -> None:
        self.engine = engine
        # Synthetic warmup's bounds; by default the workers' settings' defaults.
        self.synthesis = synthesis or SynthesisLimits(RateLimit(DEFAULT_PER_MINUTE))
        # The machine it runs on, on every event: the app keeps the hot set on a worker of
        # every node (seed 000: "keep ≥1 hot instance per node").
        self.node = node
        # This boot's id on every event: later boots have larger ones (start time in µs), so
        # the streams app tells a restart (cache lost) from leftovers of an earlier process.
        self.epoch = epoch if epoch is not None else time.time_ns() // 1000
        self.worker_id = worker_id
        self.url = url
        self.sink = sink
        self.metrics = metrics
        self.limits = limits
        self.cache_requests = cache_requests
        self.warmup_threshold = warmup_threshold
        self.lock = EngineLock(
            background_max_wait_s, on_overdue=lambda _ahead_of: metrics.engine_overdue.inc()
        )
        if hasattr(engine, "between_passes"):  # engines that run a prompt in passes
            # Through `self.lock` at each call: whichever lock the runtime holds then.
            engine.between_passes = lambda: self.lock.yield_to_requests()
        self._flush_lock = threading.Lock()
        self.snapshot = EMPTY
        self._pending: list[tuple[CacheEvent, Snapshot]] = []
        with self.lock.background():
            self._refresh()

    # -- engine work -----------------------------------------------------------------

    def prefill(
        self, token_ids: Sequence[int], *, source: str = "api", chunks: Sequence[ChunkSpan] = (),
        to_tier: bool = False, **options: Unpack[PrefillOptions],
    ) -> PrefillResult:
        """`Engine.prefill` under the lock; raises `WarmupRefused` when it cannot fit.
        `chunks`: where the prompt's chunks stand, when known (their KV is then donated);
        `to_tier`: keep it in the KV tier only."""
        try:
            with self.lock.background() as waited:
                self.metrics.engine_wait.labels(work="warmup").observe(waited)
                try:
                    result = self.engine.prefill(
                        token_ids, chunks=chunks, to_tier=to_tier, **options
                    )
                finally:
                    self._refresh()
        finally:
            self.flush()
        if result.computed_tokens:
            self.metrics.prefills.labels(source=source).inc()
        return result

    def restore_tier(self) -> int:
        """Read the KV tier's prefixes back into device memory up to the warmup threshold
        (room left for requests), under the lock; returns the prefixes restored. Each is
        published as stored, so routers see it warm again."""
        try:
            with self.lock.background():
                mem = self.engine.memory()
                room = int(mem.total * self.warmup_threshold) - mem.used
                try:
                    restored = self.engine.restore_tier(max(room, 0))
                finally:
                    self._refresh()
        finally:
            self.flush()
        return restored

    def generate(
        self,
        token_ids: Sequence[int],
        *,
        tenant: str,
        max_tokens: int,
        temperature: float,
        arrived: float,
        emit: Emit,
        chunk_refs: Iterable[ChunkKey] = (),
        chunks: Sequence[ChunkSpan] = (),
        chunk_reuse: bool = True,
    ) -> GenerationResult | None:
        """Stream a completion through `emit` (False stops it); None when it was stopped.

        `arrived` is the request's `time.perf_counter()`; TTFT counts the wait for the lock.
        With `cache_requests`, the engine also stores the prompt's full blocks unpinned from
        the request's own KV (reactive, like vLLM's automatic prefix caching).
        """
        with self.metrics.in_flight() as started, self.lock.serving() as waited:
            started()
            self.metrics.engine_wait.labels(work="request").observe(waited)
            was_empty = len(self.engine.cache) == 0
            steps = self.engine.generate(GenerateRequest(
                token_ids,
                max_tokens=max_tokens,
                tenant=tenant,
                temperature=temperature,
                cache_prompt=self.cache_requests,
                chunk_refs=chunk_refs,
                chunks=chunks,
                chunk_reuse=chunk_reuse,
            ))

            # Metrics are counted before the last step goes out: a client reading /metrics
            # right after its answer sees its request.
            def observe(result: GenerationResult, first: float) -> None:
                self._observe(result, first - arrived, was_empty)

            result = _drive(steps, emit, observe)
            if result is not None and result.stored is not None:
                self.metrics.prefills.labels(source="request").inc()
            self._refresh()
        self.flush()
        return result

    def _observe(self, result: GenerationResult, ttft_s: float, was_empty: bool) -> None:
        blocks = result.prompt_tokens // self.engine.block_size
        self.metrics.observe(
            Served(result.prompt_tokens, result.cached_tokens, blocks, ttft_s, was_empty,
                   len(result.token_ids), result.finish_reason)
        )

    # -- commands --------------------------------------------------------------------

    def apply(self, command: WarmupCommand) -> str:
        """Carry out one warmup command; returns the outcome it was counted under."""
        handler = {
            "prefill": self._cmd_prefill,
            "prefill_chunk": self._cmd_prefill_chunk,
            "invalidate": self._cmd_invalidate,
            "extend_ttl": self._cmd_extend_ttl,
            "release": self._cmd_release,
            "synthesize": self._cmd_synthesize,
        }[command.op]
        try:
            outcome = handler(command)
        except WarmupRefused as exc:
            log.warning("command %s refused: %s", command.command_id, exc.reason)
            self.send(self.refused_event(exc.reason, command.command_id))
            outcome = "refused"
        except Exception:
            self.metrics.commands.labels(op=command.op, result="error").inc()
            raise
        finally:
            self.flush()
        log.info("command %s %s: %s", command.command_id, command.op, outcome)
        self.metrics.commands.labels(op=command.op, result=outcome).inc()
        return outcome

    def _check_warmup(self, token_ids: Sequence[int], *, device: bool = True) -> None:
        try:
            # The bounds of POST /v1/prefill, before any compute: a command is no more trusted.
            check_prompt(token_ids, self.limits)
        except ApiError as exc:
            raise WarmupRefused(exc.message) from None
        if device:  # the threshold guards device memory; a tier placement leaves none used
            self.check_threshold()

    def check_threshold(self) -> None:
        """Refuse a warmup (a command or POST /v1/prefill alike) over the memory threshold."""
        # Seeds 000/003: no new warmup once memory use passes the threshold. Unpinned
        # request-cache KV is evicted to make room (as vLLM counts free blocks), so only
        # pinned bytes count; otherwise a full reactive cache would refuse every warmup.
        used, total = self.snapshot.pinned_bytes, self.snapshot.mem_total
        if not accepts_warmup(used, total, self.warmup_threshold):
            raise WarmupRefused(f"pinned memory {used}/{total} is over {self.warmup_threshold}")

    def _cmd_prefill(self, cmd: WarmupCommand) -> str:
        to_tier = cmd.placement == "tier"
        self._check_warmup(cmd.token_ids, device=not to_tier)
        result = self.prefill(
            cmd.token_ids,
            tenant=cmd.tenant,
            chunk_refs=chunk_keys(cmd.chunk_refs),
            chunks=command_spans(cmd),
            ttl_s=cmd.ttl_s,
            pin=cmd.pin,
            command_id=cmd.command_id,
            source="command",
            to_tier=to_tier,
        )
        if result.prefix_hash is None:
            return "too_short"
        return "stored" if result.computed_tokens else "already_cached"

    def _cmd_prefill_chunk(self, cmd: WarmupCommand) -> str:
        self._check_warmup([*cmd.opening_ids, *cmd.token_ids])
        (ref,) = chunk_keys(cmd.chunk_refs)  # the schema requires exactly one
        try:
            with self.lock.background() as waited:
                self.metrics.engine_wait.labels(work="warmup").observe(waited)
                try:
                    result = self.engine.prefill_chunk(
                        list(cmd.opening_ids), list(cmd.token_ids), tenant=cmd.tenant, ref=ref,
                        ttl_s=cmd.ttl_s, pin=cmd.pin, command_id=cmd.command_id,
                    )
                finally:
                    self._refresh()
        finally:
            self.flush()
        if result.prefix_hash is None:
            return "too_short"
        if not result.computed_tokens:
            return "already_cached"
        self.metrics.prefills.labels(source="command").inc()
        return "stored"

    def _cmd_invalidate(self, cmd: WarmupCommand) -> str:
        with self.lock.background():
            removed = self.engine.invalidate(
                chunk_keys(cmd.chunk_refs), tenant=cmd.tenant, prefix_hash=cmd.prefix_hash,
                command_id=cmd.command_id,
            )
            self._refresh()
        return "invalidated" if removed else "not_found"

    def _cmd_extend_ttl(self, cmd: WarmupCommand) -> str:
        assert cmd.prefix_hash is not None  # the schema requires it for this op
        with self.lock.background():
            entry = self.engine.extend_ttl(cmd.prefix_hash, cmd.ttl_s, command_id=cmd.command_id)
            self._refresh()
        return "extended" if entry is not None else "not_found"

    def _cmd_release(self, cmd: WarmupCommand) -> str:
        assert cmd.prefix_hash is not None
        with self.lock.background():
            entry = self.engine.release(cmd.prefix_hash, command_id=cmd.command_id)
            self._refresh()
        return "released" if entry is not None else "not_found"

    def _cmd_synthesize(self, cmd: WarmupCommand) -> str:
        """Sample `cmd.samples` questions about a document with this worker's model and
        report them (`synthesized`); stores nothing. Refused over the rate or memory bound."""
        assert cmd.temperature is not None  # the schema requires it for this op
        try:
            check_prompt(cmd.token_ids, self.limits)
        except ApiError as exc:
            raise WarmupRefused(exc.message) from None
        need = sampling_bytes(len(cmd.token_ids), cmd.max_new_tokens,
                              self.engine.kv_bytes_per_token)
        limit = self.synthesis
        if not within_share(need, self.snapshot.mem_total, limit.share):
            raise WarmupRefused(f"synthesis needs {need} bytes of KV, over {limit.share:.0%} "
                                f"of {self.snapshot.mem_total}")
        if not limit.rate.allow(limit.clock()):
            raise WarmupRefused(f"synthesis over {limit.rate.per_minute:g} per minute")
        texts = []
        with self.lock.background():
            primer = self.engine.detokenize(cmd.token_ids[len(cmd.token_ids) - cmd.primer_tokens:])
            for i in range(cmd.samples):
                steps = self.engine.generate(GenerateRequest(
                    cmd.token_ids, max_tokens=cmd.max_new_tokens, tenant=cmd.tenant,
                    temperature=cmd.temperature, top_k=cmd.top_k,
                    seed=None if cmd.seed is None else cmd.seed + i,
                ))
                result = _drive(steps, lambda step: True, lambda r, first: None)
                if result is not None:
                    texts.append(primer + self.engine.detokenize(result.token_ids))
            self._refresh()
        questions = clean_questions(texts)
        self.metrics.synthetic_questions.inc(len(questions))
        self.send(WorkerEvent(
            worker_id=self.worker_id, kind="synthesized", epoch=self.epoch, tenant=cmd.tenant,
            chunk_refs=cmd.chunk_refs, command_id=cmd.command_id, questions=questions,
            node=self.node,
        ))
        return "synthesized" if questions else "no_questions"

    def skip_expired(self, command: WarmupCommand) -> None:
        """A command read after its expiry (a restart resuming old offsets): not carried
        out, counted and reported so the app can send a fresh one where it is still wanted."""
        log.info("command %s %s expired at %s: skipped", command.command_id, command.op,
                 command.expires_at)
        self.metrics.commands.labels(op=command.op, result="expired").inc()
        self.send(
            WorkerEvent(
                worker_id=self.worker_id,
                kind="expired",
                epoch=self.epoch,
                tenant=command.tenant,
                prefix_hash=command.prefix_hash,
                command_id=command.command_id,
            )
        )

    # -- events ----------------------------------------------------------------------

    def tick(self, lock_timeout_s: float = 1.0) -> None:
        """Expire entries past their TTL (skipped while the engine is busy) and publish."""
        if self.lock.try_background(lock_timeout_s):
            try:
                self.engine.expire()
                self._refresh()
            finally:
                self.lock.release()
        self.flush()

    def status_event(self, kind: Literal["ready", "heartbeat", "stopped"]) -> WorkerEvent:
        """A `ready`, `heartbeat` or `stopped` event with the current memory figures."""
        snap = self.snapshot
        return WorkerEvent(
            worker_id=self.worker_id,
            kind=kind,
            epoch=self.epoch,
            node=self.node,
            url=self.url,
            mem_used_bytes=snap.mem_used,
            mem_total_bytes=snap.mem_total,
            pinned_bytes=snap.pinned_bytes,
            entries=len(snap.entries),
            warm_prefixes=snap.prefixes,
            tier_prefixes=list(snap.tier_prefixes[-MAX_TIER_PREFIXES:]),
            tier_bytes=snap.tier_bytes,
            tier_total_bytes=snap.tier_total,
        )

    def refused_event(self, reason: str, command_id: str | None) -> WorkerEvent:
        """A `refused` event telling the sender of a command why nothing was done."""
        return WorkerEvent(
            worker_id=self.worker_id,
            kind="refused",
            epoch=self.epoch,
            node=self.node,
            command_id=command_id,
            reason=reason[:1024],
        )

    def send(self, event: WorkerEvent) -> None:
        self.metrics.events.labels(kind=event.kind).inc()
        self.sink.send(event)

    def flush(self) -> None:
        """Publish the cache changes queued by `_refresh`, in the order they happened."""
        with self._flush_lock:
            events, self._pending = self._pending, []
            for ev, snap in events:
                self.send(self._cache_event(ev, snap))

    def _cache_event(self, ev: CacheEvent, snap: Snapshot) -> WorkerEvent:
        return WorkerEvent(
            worker_id=self.worker_id,
            kind=ev.kind,
            epoch=self.epoch,
            node=self.node,
            tenant=ev.tenant,
            prefix_hash=ev.prefix_hash,
            prefix_tokens=ev.n_tokens,
            bytes=ev.nbytes,
            chunk_refs=[ChunkRef(chunk_id=c, content_hash=h) for c, h in sorted(ev.chunk_refs)],
            command_id=ev.command_id,
            mem_used_bytes=snap.mem_used,
            mem_total_bytes=snap.mem_total,
            pinned_bytes=snap.pinned_bytes,
            entries=len(snap.entries),
        )

    def _refresh(self) -> None:
        """Rebuild the snapshot and the cache gauges; call with the lock held."""
        cache = self.engine.cache
        mem = self.engine.memory()
        now = time.monotonic()
        entries = tuple(entry_summary(e, now) for e in cache.entries())
        blocks = asdict(cache.block_stats())
        tier, tier_bytes = self.engine.tier_state()
        self.snapshot = Snapshot(
            mem.used, mem.total, cache.pinned_bytes, entries, blocks, tuple(tier), tier_bytes,
            self.engine.tier_total(),
        )
        # Queued here, under the lock, so concurrent operations publish in cache order.
        self._pending.extend((ev, self.snapshot) for ev in cache.drain_events())
        self.metrics.cache_state(
            used=mem.used,
            capacity=mem.total,
            entries=len(entries),
            pinned=sum(1 for e in entries if e["pinned"]),
        )
        self.metrics.block_state(blocks)


def _drive(
    steps: Iterable[GenerationStep],
    emit: Emit,
    on_result: Callable[[GenerationResult, float], None],
) -> GenerationResult | None:
    """Feed steps to `emit`; `on_result(result, first step time)` runs before the last one.

    Returns the result, or None when `emit` asked to stop.
    """
    first = 0.0
    iterator = iter(steps)
    try:
        for step in iterator:
            first = first or time.perf_counter()
            if step.result is not None:
                on_result(step.result, first)
                emit(step)  # the answer is complete: a client leaving now stops nothing
                return step.result
            if not emit(step):
                return None
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    return None
