"""The warmup policy interface, the simple policies, and the name -> class map."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from schemas import KbChange, QueryEvent, WarmupCommand
from schemas.prefix import prefix_kv_bytes
from streams.decide.logic import command_id

if TYPE_CHECKING:  # the heavy modules (torch, Qdrant) load only when a run starts
    from rag.index import IndexResult
    from ragwarm.bench.strategies.settings import StrategySettings
    from ragwarm.trace import Question
    from streams.handle.ports import WarmPrefix
    from streams.sim import SimRag
    from workers.sim import SimWorker


class SimClock:
    """Simulated seconds since the start of the run; caches and policies read it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class PolicyContext:
    """What a policy may use: its worker, the shared RAG layer, settings and past traffic."""

    worker: SimWorker
    rag: SimRag  # the real store in the benchmark, a query log offline
    settings: StrategySettings
    clock: SimClock
    past: Sequence[Question]  # yesterday's distinct questions, most asked first

    @contextmanager
    def at(self, when: float) -> Iterator[None]:
        """Run a timer of the policy's at `when`, the time it fell due (at or before the
        step being ticked), then go back to the step's time."""
        now = self.clock.now
        self.clock.now = min(when, now)
        try:
            yield
        finally:
            self.clock.now = now

    @property
    def tenant(self) -> str:
        return self.settings.tenant

    def prefill(self, prefix: WarmPrefix, *, pin: bool, ttl_s: float | None, why: str) -> str:
        """Send one prefill command to the worker, as the streams app would."""
        return self.worker.apply(WarmupCommand(
            command_id=command_id(), op="prefill", worker_id=self.worker.worker_id,
            prefix_hash=prefix.prefix_hash, tenant=self.tenant, token_ids=prefix.token_ids,
            chunk_refs=prefix.chunk_refs, chunk_spans=prefix.chunk_spans, ttl_s=ttl_s, pin=pin,
            reason=why,
        ))

    def release(self, prefix_hash: str, why: str) -> str:
        return self.worker.apply(WarmupCommand(
            command_id=command_id(), op="release", prefix_hash=prefix_hash, tenant=self.tenant,
            reason=why,
        ))

    def prefix_bytes(self, prefix: WarmPrefix) -> int:
        engine = self.worker.engine
        return prefix_kv_bytes(len(prefix.token_ids), engine.kv_bytes_per_token,
                               engine.block_size)


class Policy:
    """A warmup policy: reacts to the run's start, time, KB changes and answered queries.

    Subclasses set `name`, `cache_requests` (whether the worker caches each served prompt,
    like vLLM's automatic prefix caching), `disk_tier` (whether the worker keeps the disk
    KV tier below device memory), `host_tier` (whether it keeps the worker's default host
    tier) and `eviction` (its worker's eviction policy), and override the hooks they need.
    """

    name: ClassVar[str]
    cache_requests: ClassVar[bool] = True
    disk_tier: ClassVar[bool] = False
    # The worker's host KV tier at its default size (`RAGWARM_WORKER_HOST_TIER_BYTES`, unset:
    # as large as the KV budget): the product default keeps it, and so does the peer it is
    # compared with for that memory (`reactive-offload`); the policies it contains do not.
    host_tier: ClassVar[bool] = False
    # Whether its worker blends held chunk KV into prompts (RAGWARM_WORKER_CHUNK_REUSE).
    chunk_reuse: ClassVar[bool] = False
    # Whether its decisions read the model's output (sampled questions): such a policy, like
    # one with a disk tier, cannot run on the model-free cost engine (which does blend: a
    # blend's cost needs no tensors).
    needs_model: ClassVar[bool] = False
    # The eviction of the system it stands for: LRU for the systems the seeds compare with
    # (vLLM's automatic prefix caching evicts least recently used blocks); None: ragwarm's
    # worker, `RAGWARM_WORKER_EVICTION_POLICY` (the streams app's policies). The fair bench
    # runs every policy on ragwarm's worker's eviction (`same_eviction`, the default).
    eviction: ClassVar[str | None] = "lru"
    # Request caching per block, as vLLM's prefix caching: each block of a prompt is its own
    # eviction unit, a hit touches every block along the match, and a prompt's tail blocks
    # go before its head (`workers.kv.request_blocks`). None: ragwarm's worker's setting
    # (`RAGWARM_WORKER_REQUEST_CACHING`), as the streams app's policies run.
    block_level: ClassVar[bool | None] = None

    @classmethod
    def request_caching(cls, worker_caching: str) -> str:
        """How its worker's request caching evicts ("block" or "entry"), where ragwarm's
        worker's does by `worker_caching`."""
        if cls.block_level is None:
            return worker_caching
        return "block" if cls.block_level else "entry"

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    @classmethod
    def eviction_on(cls, worker_policy: str, *, same: bool = True) -> str:
        """The eviction policy of its worker, where ragwarm's worker evicts by
        `worker_policy` (its `RAGWARM_WORKER_EVICTION_POLICY`): that one for every policy
        when `same`, else the eviction of the system the policy stands for."""
        return worker_policy if same else cls.eviction or worker_policy

    def logged(self, query: QueryEvent) -> None:
        """A query of yesterday's log (before the run, no worker up): replayed so a policy
        that keeps state over the query stream can rebuild it."""

    def start(self) -> None:
        """The worker is up: at the run's start (the initial KB indexed, no query asked
        today) and again after a restart (its device cache empty)."""

    def tick(self, now: float) -> None:
        """The clock reached `now` (called before every step of the timeline)."""

    def kb_change(self, change: KbChange, result: IndexResult) -> None:
        """The shared store has just applied `change`."""

    def served(self, query: QueryEvent) -> None:
        """The worker answered a query; `query` is what the RAG client would publish."""

    def figures(self) -> dict[str, float | int | None]:
        """Figures of the policy's own, reported beside the common ones (none by default)."""
        return {}


class NoReuse(Policy):
    """`none`: every prompt is computed in full; nothing is ever cached."""

    name: ClassVar[str] = "none"
    cache_requests: ClassVar[bool] = False


class Reactive(Policy):
    """`reactive`: only the worker's request caching, per block (vLLM automatic prefix
    caching; LRU unless the bench runs every policy on the same eviction)."""

    name: ClassVar[str] = "reactive"
    block_level: ClassVar[bool] = True


class ReactiveOffload(Reactive):
    """`reactive-offload`: request caching over the same host KV tier `hybrid` keeps (vLLM
    prefix caching with LMCache-style CPU offload): the peer to compare the product default
    with, as both hold the same bytes."""

    name: ClassVar[str] = "reactive-offload"
    host_tier: ClassVar[bool] = True
    # Per entry still: its tier spills what an eviction frees, and per-block entries on the
    # torch engine with a tier are not measured yet.
    block_level: ClassVar[bool] = False


class History(Policy):
    """`history`: at start, prefill yesterday's prompts (prefix and question) until memory
    is full (seed 000's full history prefill); request caching afterwards.

    Its best form: the most asked are chosen first, and prefilled last, so that an
    eviction by recency (or SLRU's storing order) takes the least asked first; and each is
    the whole prompt, since a repeat of the question then reuses its question's tokens too.
    """

    name: ClassVar[str] = "history"

    def start(self) -> None:
        for prefix in reversed(self.chosen()):
            if self.ctx.prefill(prefix, pin=False, ttl_s=None, why="history") == "refused":
                break

    def chosen(self) -> list[WarmPrefix]:
        """Yesterday's prompts, most asked first, that fit the free memory together."""
        cache, tenant = self.ctx.worker.cache, self.ctx.tenant
        free = cache.budget.max_bytes - cache.bytes_used
        picked: list[WarmPrefix] = []
        seen: set[tuple[int, ...]] = set()
        for question in self.ctx.past:
            prefix = self.ctx.rag.prefix_for_question(question.question, tenant)
            if prefix is None:
                continue
            prompt = with_question(prefix, self.ctx.rag.question_ids(question.question))
            size, ids = self.ctx.prefix_bytes(prompt), tuple(prompt.token_ids)
            if ids in seen:
                continue
            if size > free:
                break
            picked.append(prompt)
            seen.add(ids)
            free -= size
        return picked


def with_question(prefix: WarmPrefix, question_ids: Sequence[int]) -> WarmPrefix:
    """`prefix` with a question's tokens after it: the whole prompt that question sends."""
    return replace(prefix, token_ids=[*prefix.token_ids, *question_ids])


class Scheduled(Policy):
    """`scheduled`: a fixed warm set (yesterday's top questions within `scheduled_share` of
    memory) re-retrieved and prefilled on a timer (seed 003's scheduled warming)."""

    name: ClassVar[str] = "scheduled"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.warm: dict[str, str] = {}  # qid -> prefix hash pinned for it
        self.next_at = 0.0

    def tick(self, now: float) -> None:
        if now >= self.next_at:
            self.refresh()
            self.next_at = now + self.ctx.settings.scheduled_period_s

    def start(self) -> None:
        self.tick(self.ctx.clock())

    def refresh(self) -> None:
        budget = self.ctx.settings.scheduled_share * self.ctx.worker.cache.budget.max_bytes
        used, ttl = 0, 2 * self.ctx.settings.scheduled_period_s
        for question in self.ctx.past:
            prefix = self.ctx.rag.prefix_for_question(question.question, self.ctx.tenant)
            if prefix is None:
                continue
            size = self.ctx.prefix_bytes(prefix)
            if used + size > budget:
                break
            old = self.warm.get(question.qid)
            if old is not None and old != prefix.prefix_hash:
                self.ctx.release(old, "scheduled refresh: retrieval changed")
            if self.ctx.prefill(prefix, pin=True, ttl_s=ttl, why="scheduled") != "refused":
                self.warm[question.qid] = prefix.prefix_hash
                used += size


# Name -> "module:class", in the order tables list them; classes load on first use.
POLICIES: dict[str, str] = {
    "none": "ragwarm.bench.strategies.policies:NoReuse",
    "reactive": "ragwarm.bench.strategies.policies:Reactive",
    "scheduled": "ragwarm.bench.strategies.policies:Scheduled",
    "history": "ragwarm.bench.strategies.policies:History",
    "event-rag": "ragwarm.bench.strategies.streams_policy:EventRag",
    "hot-tokens": "ragwarm.bench.strategies.streams_policy:HotTokens",
    "hybrid": "ragwarm.bench.strategies.streams_policy:Hybrid",
    "hybrid-noblend": "ragwarm.bench.strategies.streams_policy:HybridNoBlend",
    "hybrid-chunks": "ragwarm.bench.strategies.blend_policy:HybridChunks",
    "hybrid-blend": "ragwarm.bench.strategies.blend_policy:HybridBlend",
    "tiered": "ragwarm.bench.strategies.tiered:TieredHybrid",
    "reactive-offload": "ragwarm.bench.strategies.policies:ReactiveOffload",
    "synthetic": "ragwarm.bench.strategies.synthetic:Synthetic",
}


def policy_names() -> list[str]:
    return list(POLICIES)


def model_free(cls: type[Policy]) -> bool:
    """Whether `cls` runs on the model-free cost engine: its cache decisions need neither
    tensors (disk tier) nor the model's text."""
    return not (cls.disk_tier or cls.needs_model)


def policy_class(name: str) -> type[Policy]:
    """The policy called `name`; the error lists the valid names."""
    try:
        target = POLICIES[name]
    except KeyError:
        valid = ", ".join(POLICIES)
        raise ValueError(f"unknown warmup policy {name!r}; valid names: {valid}") from None
    module, _, attr = target.partition(":")
    cls: type[Policy] = getattr(importlib.import_module(module), attr)
    return cls
