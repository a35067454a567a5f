"""The gateway client's own view of the workers, pure: `worker.events` folded as the streams app
folds them (`streams.decide.fleet`), and the route it gives without asking the app.

Serving routers that route by cache state (llm-d, Dynamo) build their view from the
workers' KV events themselves and route by load when that view goes stale; the gateway
does the same, so routing keeps working while the streams app restarts.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ragwarm.client.fallback import InFlight, by_load
from ragwarm.client.wire import Route, WorkerRef
from schemas import WorkerEvent
from streams.decide.fleet import (
    EpochCheck,
    Folded,
    fold_worker_event,
    mark_stale,
    route_answer,
)
from streams.decide.records import WorkerState

EVENTS = "events"  # chosen by the prefix it holds, from the gateway's own view of worker.events
FALLBACK_STALE_VIEW = "fallback:stale-view"  # by load: no worker event for a while, no app


@dataclass(frozen=True)
class ViewRules:
    """How the view judges what it reads (the streams app's settings of the same name)."""

    master: str | None  # the signing secret; None: unsigned events are taken (insecure)
    worker_stale_s: float = 30.0  # a worker not heard from for this long is not ready
    quiet_s: float = 15.0  # no event at all for this long: the view is not fresh
    epoch_ahead_s: float = 300.0  # a boot epoch further ahead of this clock is refused


@dataclass
class WorkerView:
    """Worker rows from `worker.events`, on the wall clock (record times, so events read
    back after a restart are as old as they are). One thread folds, others route: every
    method holds the lock."""

    rules: ViewRules
    rows: dict[str, WorkerState] = field(default_factory=dict)
    last_event_at: float | None = None
    ignored: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def apply(self, event: WorkerEvent, at: float) -> Folded:
        """Fold one event read at wall time `at`; an ignored one is counted by why."""
        with self._lock:
            prior = self.rows.get(event.worker_id)
            quiet = prior is not None and at - prior.last_seen > self.rules.worker_stale_s
            check = EpochCheck(now_us=int(at * 1_000_000),
                               ahead_us=int(self.rules.epoch_ahead_s * 1_000_000), expired=quiet)
            order, state = fold_worker_event(prior, event, at, check, self.rules.master)
            if state is None:
                self.ignored[order] += 1
                return order
            self.rows[event.worker_id] = state
            self.last_event_at = max(at, self.last_event_at or at)
            return order

    def fresh(self, now: float) -> bool:
        """Whether an authentic event arrived within `quiet_s` (workers heartbeat every
        few seconds, so silence means the feed or the broker is away)."""
        with self._lock:
            return self.last_event_at is not None and now - self.last_event_at <= \
                self.rules.quiet_s

    def live(self, now: float) -> list[WorkerState]:
        with self._lock:
            return mark_stale(list(self.rows.values()), now, self.rules.worker_stale_s)

    def healthy(self) -> list[WorkerRef]:
        """Workers whose last word was that they serve (ready, with a URL), by id."""
        with self._lock:
            rows = sorted(self.rows.values(), key=lambda w: w.worker_id)
        return [WorkerRef(w.worker_id, w.url) for w in rows if w.ready and w.url]


def fresh_route(view: WorkerView, hashes: Sequence[str], now: float) -> Route | None:
    """The route the streams app would give, from the gateway's own view while it is fresh;
    None when it is not fresh or holds no ready worker."""
    if not view.fresh(now):
        return None
    route = Route.from_json(route_answer(view.live(now), hashes))
    return route if route.chosen is not None else None


def stale_route(view: WorkerView, in_flight: InFlight) -> Route | None:
    """Any worker the view last knew healthy, the least loaded first (no prefix match
    claimed: the view may be out of date); None when it knows none."""
    ordered = by_load(view.healthy(), in_flight)
    return Route(ordered[0], 0, tuple(ordered)) if ordered else None
