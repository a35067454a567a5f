"""Routing without the streams app, pure: the worker table a client last learned, its
in-flight counts, and the load-based route it falls back on when `/ragwarm/route` fails.

The sync and async clients share this bookkeeping (their I/O differs, their rules must not).
Serving routers (llm-d, Dynamo) keep routing off the warmup path the same way: when the
cache-aware view is unavailable they route by load, and say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from ragwarm.client.wire import UP_HINT, Route, StreamsUnavailable, WorkerRef

ROUTED = "streams"  # the streams app chose the worker by the prefix it holds
FALLBACK = "fallback:streams-unavailable"  # chosen by load from a table learned in time
FALLBACK_STALE = "fallback:streams-unavailable:stale-table"  # ... from an old table

RetrievalMode = Literal["streams", "qdrant", "auto"]
RETRIEVAL_HINT = ("retrieval goes through the streams app, so no question is answered while it "
                  "is down; with a Qdrant server (RAGWARM_QDRANT_URL) the client retrieves "
                  "without it (RAGWARM_CLIENT_RETRIEVAL=auto or qdrant)")


def retrieval_unavailable(exc: StreamsUnavailable) -> StreamsUnavailable:
    """The streams app's error for a retrieval, with what it means and how to avoid it."""
    return StreamsUnavailable(f"{exc}; {RETRIEVAL_HINT}")


def retrieval_backend(mode: RetrievalMode, qdrant_url: str | None) -> Literal["streams", "qdrant"]:
    """Where a client retrieves: `auto` is Qdrant when a server URL is set, else the streams
    app; `qdrant` without a URL is a configuration error, said at start rather than per query."""
    if mode == "qdrant" and not qdrant_url:
        raise ValueError("RAGWARM_CLIENT_RETRIEVAL=qdrant needs RAGWARM_QDRANT_URL (the Qdrant "
                         "server the streams app indexes into); set it, or use auto/streams")
    if mode == "streams" or (mode == "auto" and not qdrant_url):
        return "streams"
    return "qdrant"


@dataclass
class InFlight:
    """Requests this client has open per worker (the load it can see without asking)."""

    counts: dict[str, int] = field(default_factory=dict)

    def start(self, worker_id: str) -> None:
        self.counts[worker_id] = self.counts.get(worker_id, 0) + 1

    def end(self, worker_id: str) -> None:
        left = self.counts.get(worker_id, 0) - 1
        if left > 0:
            self.counts[worker_id] = left
        else:
            self.counts.pop(worker_id, None)

    def of(self, worker_id: str) -> int:
        return self.counts.get(worker_id, 0)


@dataclass
class WorkerTable:
    """The ready workers a client last learned (from a route answer or the worker list at
    open) and when, on a monotonic clock. `learned_at` None: never learned."""

    workers: tuple[WorkerRef, ...] = ()
    learned_at: float | None = None

    def learn(self, workers: Iterable[WorkerRef], now: float) -> None:
        """Replace the table with what the streams app just said (an empty list is news too:
        no worker is ready)."""
        unique: dict[str, WorkerRef] = {}
        for worker in workers:
            unique.setdefault(worker.worker_id, worker)
        self.workers = tuple(unique.values())
        self.learned_at = now

    def age_s(self, now: float) -> float | None:
        return None if self.learned_at is None else max(0.0, now - self.learned_at)

    def fresh(self, now: float, max_age_s: float) -> bool:
        age = self.age_s(now)
        return age is not None and age <= max_age_s


def by_load(workers: Iterable[WorkerRef], in_flight: InFlight) -> list[WorkerRef]:
    """Workers with the fewest requests in flight first; ties keep the table's order."""
    return sorted(workers, key=lambda w: in_flight.of(w.worker_id))  # sorted is stable


def fallback_route(table: WorkerTable, in_flight: InFlight, now: float, max_age_s: float,
                   cause: StreamsUnavailable) -> tuple[Route, str]:
    """The route to take when the streams app cannot route: the least loaded known worker
    first, the others after it for failover, no prefix match claimed; with its routing label.
    With no known worker, the streams app's own error (with the fix) plus why no fallback."""
    if not table.workers:
        raise StreamsUnavailable(f"{cause}; and no worker is known to route to without it "
                                 f"(none learned since the client opened). {UP_HINT}")
    ordered = by_load(table.workers, in_flight)
    label = FALLBACK if table.fresh(now, max_age_s) else FALLBACK_STALE
    return Route(ordered[0], 0, tuple(ordered)), label
