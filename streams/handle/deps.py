"""What every streams handler is handed: the tables, the outbox, the RAG port, the clock.

Apart from `streams.handle.handlers` so that modules of handlers (the ready-worker warmup) share
it without importing one another.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from schemas import ChunkRef, WarmupCommand
from streams.decide.asks import AskLog
from streams.decide.chunks import WarmedChunks
from streams.decide.fleet import EpochCheck, mark_stale
from streams.decide.hot import HotTracker
from streams.decide.pacing import KeyPacing
from streams.decide.records import (
    DocLink,
    DocState,
    PrefixOp,
    PrefixState,
    ReadyRewarm,
    WorkerState,
)
from streams.decide.synthetic import SyntheticState
from streams.handle.ports import IndexReplica, RagPort
from streams.settings import StreamsSettings

Table = MutableMapping[str, Any]
M = TypeVar("M", bound=BaseModel)
# Changes remembered between attempts (`HandlerDeps.applying`): one per partition at a time
# but for those a permanent failure left behind.
APPLYING_MAX = 1024


class Outbox(Protocol):
    """Where the handlers' output goes: the internal topics and the workers' commands."""

    async def op(self, op: PrefixOp) -> None:
        """To `ragwarm.prefix-ops`, keyed by the prefix hash."""

    async def link(self, link: DocLink) -> None:
        """To `ragwarm.doc-links`, keyed by the doc id."""

    async def command(self, cmd: WarmupCommand) -> None:
        """To `warmup.commands`, keyed by the prefix hash."""

    async def ready(self, req: ReadyRewarm) -> None:
        """To every partition of `ragwarm.worker-ready` (one request per partition)."""


class Clock(Protocol):
    """Seconds now. A callback protocol, not `Callable`: mypy reads a dataclass field typed
    `Callable` as read-only, so `HandlerDeps` would not match the narrower `HandlerDeps`
    protocols of `chunk_warm` and `synthesize` (which declare a settable `clock`)."""

    def __call__(self) -> float: ...


class Rows(Generic[M]):
    """A table's rows as typed models. The table keeps their JSON (`model_dump(mode="json")`,
    never pickle) so its changelog stays readable; this is the one place that converts."""

    def __init__(self, table: Table, model: type[M]) -> None:
        self.table, self.model = table, model

    def get(self, key: str) -> M | None:
        raw = self.table.get(key)
        return self.model.model_validate(raw) if raw else None

    def __getitem__(self, key: str) -> M:
        row = self.get(key)
        if row is None:
            raise KeyError(key)
        return row

    def __setitem__(self, key: str, row: M) -> None:
        self.table[key] = row.model_dump(mode="json")

    def items(self) -> list[tuple[str, M]]:
        """Every row, read now (a snapshot: handlers write the table while they go)."""
        return [(k, self.model.model_validate(v)) for k, v in list(self.table.items()) if v]

    def values(self) -> list[M]:
        return [row for _, row in self.items()]


@dataclass
class StreamTables:
    """The app's state; Faust changelog tables in the app, dicts in the benchmark. Handlers
    read and write the rows through `doc_states`, `prefix_states` and `worker_states`."""

    docs: Table  # doc_key(tenant, doc_id) -> DocState
    doc_prefixes: Table  # doc_key(tenant, doc_id) -> {prefix hash: [chunk refs]}
    prefixes: Table  # prefix hash -> PrefixState
    workers: Table  # worker id -> WorkerState (read by every partition)

    @property
    def doc_states(self) -> Rows[DocState]:
        return Rows(self.docs, DocState)

    @property
    def prefix_states(self) -> Rows[PrefixState]:
        return Rows(self.prefixes, PrefixState)

    @property
    def worker_states(self) -> Rows[WorkerState]:
        return Rows(self.workers, WorkerState)

    def dependents(self, key: str) -> dict[str, list[ChunkRef]]:
        """The prefixes built from document `key`'s chunks, each with its chunk refs (the
        `doc_prefixes` row, decoded; `streams.decide.logic.apply_doc_link` writes it)."""
        links = self.doc_prefixes.get(key) or {}
        return {h: [ChunkRef.model_validate(r) for r in refs] for h, refs in links.items()}


@dataclass
class Readiness:
    """What `/ragwarm/health/ready` reports: tables recovered and the index consistent with
    them. KB changes wait for `index` (re-indexing must not race them). Set by default:
    only the Faust app, which recovers, clears it."""

    index: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = "ready"

    def __post_init__(self) -> None:
        self.index.set()

    def wait_for_recovery(self) -> None:
        self.index.clear()
        self.reason = "recovering tables"

    def recovered(self) -> None:
        self.reason = "ready"
        self.index.set()


@dataclass
class HandlerDeps:
    """Everything the handlers share: tables, outbox, the RAG port, clock and counters."""

    tables: StreamTables
    out: Outbox
    rag: RagPort
    settings: StreamsSettings
    tracker: HotTracker
    clock: Clock = time.time
    # This host's wall clock, whatever `clock` is (the benchmark's is simulated): what the
    # workers' boot epochs (their wall clocks) are bounded by (`handlers.epoch_check`).
    wall_clock: Clock = time.time
    stats: Counter = field(default_factory=Counter)
    # Qdrant local mode and the embedder are not safe to share across threads: in the app
    # one thread runs every store call, off the event loop. None runs them inline.
    executor: Executor | None = None
    # The hot-tick timer and a worker's `ready` both re-plan the hot set; one at a time.
    hot_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    readiness: Readiness = field(default_factory=Readiness)
    # The part of the RAG layer still loading in the background (ragwarm.rag_loading), None
    # once loaded: the ready probe waits for it too and names it.
    loading: Callable[[], str | None] = field(default=lambda: None)
    # The partition of a table key among n (the producer's partitioner in the app).
    partition_of: Callable[[str, int], int] = field(default=lambda key, n: 0)
    # The index replica fed by rag.chunks (streams.shell.replica); None: nothing to publish.
    replica: IndexReplica | None = None
    # The share of the rag.queries partitions this process owns: with N instances each
    # plans the hot set of its own tenants within that share of the hot-token budget.
    owned_share: Callable[[], float] = field(default=lambda: 1.0)
    synthetic: SyntheticState = field(default_factory=SyntheticState)  # this process's
    query_ops: KeyPacing = field(default_factory=KeyPacing)  # when each prefix's last went
    # When each hot prefix whose question retrieved nothing was last retrieved (`plan_hot`).
    hot_unfound: KeyPacing = field(default_factory=KeyPacing)
    chunk_warmed: WarmedChunks = field(default_factory=WarmedChunks)  # this process's sends
    # The asks of the last `edit_hold_s` that edits rank by (`edit_watch`), this process's.
    asks: AskLog = field(init=False)
    # (doc key, version) -> the docs table's state before that change was first applied,
    # until it was applied whole (`handlers.apply_indexed`; a retry plans from it again).
    applying: dict[tuple[str, int], DocState | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.asks = AskLog(self.settings.edit_hold_s)

    def kv_bytes_per_token(self) -> int:
        """KV bytes one token takes on the workers: as their `stored` events report it,
        the setting until one has."""
        return int(self.stats.get("kv_bytes_per_token") or self.settings.kv_bytes_per_token)

    async def blocking(self, fn: Callable, *args):
        if self.executor is None:
            return fn(*args)
        queued = time.perf_counter()

        def timed():
            # Per store call: time queued behind others on the one thread, and time run
            # (`exec_wait_ms`, `exec_<fn>_ms`): where an edit's way to warm waits.
            began = time.perf_counter()
            try:
                return fn(*args)
            finally:
                name = getattr(fn, "__name__", "call")
                self.stats["exec_wait_ms"] += round((began - queued) * 1000)
                self.stats[f"exec_{name}_ms"] += round((time.perf_counter() - began) * 1000)
                self.stats[f"exec_{name}_calls"] += 1

        return await asyncio.get_running_loop().run_in_executor(self.executor, timed)

    def first_prior(self, key: str, version: int) -> DocState | None:
        """The docs table's state of `key` as the first attempt at applying `version` read
        it (read now on a first attempt): a retry after the table was written planned from
        the new state, found nothing changed and skipped the follow-up work (re-checks,
        chunk warmup, synthesis)."""
        if (key, version) not in self.applying:
            self.applying[(key, version)] = self.tables.doc_states.get(key)
            while len(self.applying) > APPLYING_MAX:  # one left by a permanent failure
                del self.applying[next(iter(self.applying))]
        return self.applying[(key, version)]

    def epoch_check(self, prior: WorkerState | None) -> EpochCheck:
        """Epochs are the workers' wall clocks (microseconds), so they are bounded by this
        host's (`wall_clock`, not `clock`: the benchmark simulates that one)."""
        quiet = prior is not None and self.clock() - prior.last_seen > self.settings.worker_stale_s
        return EpochCheck(now_us=int(self.wall_clock() * 1_000_000),
                          ahead_us=int(self.settings.epoch_ahead_s * 1_000_000), expired=quiet)

    def live_workers(self) -> list[WorkerState]:
        rows = list(self.tables.worker_states.values())
        return mark_stale(rows, self.clock(), self.settings.worker_stale_s)
