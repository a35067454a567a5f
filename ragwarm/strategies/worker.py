"""One policy's worker: the real `WorkerRuntime` over a torch engine sharing the loaded weights."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from schemas import ChunkRef, WarmupCommand, WorkerEvent
from streams import logic
from streams.records import WorkerState
from workers.api import Limits
from workers.cache import ChunkKey, PrefixCache
from workers.engines.base import GenerationResult
from workers.engines.torch_engine import TorchEngine
from workers.memory import MEMORY_THRESHOLD, Budget, accepts_warmup
from workers.metrics import WorkerMetrics
from workers.runtime import WorkerRuntime

Basis = Literal["pinned", "all"]


class _Events:
    """The worker's event sink: kept in memory for the policy's bookkeeping."""

    def __init__(self) -> None:
        self.pending: list[WorkerEvent] = []

    def send(self, event: WorkerEvent) -> None:
        self.pending.append(event)

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Served:
    """One answered query on this worker: the engine's measured result and the entry used."""

    result: GenerationResult
    entry_refs: frozenset[ChunkKey]


class SimWorker:
    """A worker as deployed (runtime, commands, reactive caching), on the simulated clock."""

    def __init__(
        self,
        engine: TorchEngine,
        clock: Callable[[], float],
        *,
        worker_id: str,
        cache_requests: bool,
        basis: Basis,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.basis = basis
        self.sink = _Events()
        # With the `pinned` basis this class applies the threshold itself (to pinned bytes).
        threshold = MEMORY_THRESHOLD if basis == "all" else 1.0
        self.runtime = WorkerRuntime(
            engine, worker_id=worker_id, url=f"sim://{worker_id}", sink=self.sink,
            metrics=WorkerMetrics(worker_id=worker_id, model_name=engine.model_id),
            limits=Limits(1 << 15, 1, 1 << 15, 1 << 20), cache_requests=cache_requests,
            warmup_threshold=threshold,
        )
        self.refs: dict[str, frozenset[ChunkKey]] = {}
        self.state = WorkerState(worker_id=worker_id)
        self.warm_seconds = 0.0
        self.outcomes: Counter[str] = Counter()
        self._drain()

    @property
    def cache(self) -> PrefixCache:
        return self.engine.cache

    def serve(self, token_ids: Sequence[int], tenant: str, refs: Sequence[ChunkRef]) -> Served:
        """Answer with one token (TTFT measured by the engine); with request caching the
        engine also stores the prompt's blocks from the request's own KV."""
        keys = [(r.chunk_id, r.content_hash) for r in refs]
        result = self.runtime.generate(
            token_ids, tenant=tenant, max_tokens=1, temperature=0.0,
            arrived=time.perf_counter(), emit=lambda step: True, chunk_refs=keys,
        )
        if result is None:
            raise RuntimeError("the runtime stopped a generation nobody cancelled")
        used = self.refs.get(result.prefix_hash or "", frozenset())
        self._drain()
        return Served(result, used)

    def apply(self, command: WarmupCommand) -> str:
        """Carry out a warmup command as the worker does; prefill time is warmup time."""
        if command.op == "prefill" and not self.accepts_warmup():
            outcome = "refused"
        else:
            started = time.perf_counter()
            outcome = self.runtime.apply(command)
            if command.op == "prefill":
                self.warm_seconds += time.perf_counter() - started
        self.outcomes[f"{command.op}:{outcome}"] += 1
        self._drain()
        return outcome

    def accepts_warmup(self) -> bool:
        used, total = self.memory_used(), self.cache.budget.max_bytes
        return accepts_warmup(used, total, MEMORY_THRESHOLD)

    def memory_used(self) -> int:
        """Bytes counted against the warmup threshold under this worker's basis."""
        return self.cache.pinned_bytes if self.basis == "pinned" else self.cache.bytes_used

    def expire(self) -> None:
        self.runtime.tick()
        self._drain()

    def heartbeat(self) -> WorkerState:
        """The streams app's row for this worker after a heartbeat (memory under the basis)."""
        event = self.runtime.status_event("heartbeat")
        self.state = logic.apply_worker_event(self.state, event, self.clock())
        # Placement compares `pinned` with the threshold; under the `all` basis every
        # cached byte counts there (the rule before workers counted pinned bytes only).
        used = self.memory_used()
        self.state = self.state.model_copy(update={"mem_used": used, "pinned": used})
        return self.state

    def _drain(self) -> None:
        events, self.sink.pending = self.sink.pending, []
        for event in events:
            if event.kind == "stored" and event.prefix_hash:
                self.refs[event.prefix_hash] = frozenset(
                    (r.chunk_id, r.content_hash) for r in event.chunk_refs
                )


def make_cache(budget: Budget, clock: Callable[[], float], block_size: int) -> PrefixCache:
    """An LRU prefix cache on the simulated clock; entries live until evicted unless a TTL
    is given (request caching, like vLLM's, has no TTL)."""
    return PrefixCache(budget, policy="lru", clock=clock, default_ttl_s=None,
                       block_size=block_size)
