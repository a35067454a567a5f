"""What the app knows of its workers, as pure functions: placement, rows, boot epochs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from schemas import WorkerEvent
from schemas.events import MEMORY_THRESHOLD
from schemas.signing import authentic_under_master
from streams.decide.records import WorkerState


def holders_of(prefix_hash: str, workers: Iterable[WorkerState]) -> list[str]:
    return [w.worker_id for w in workers if prefix_hash in w.prefixes]


def cold_weight(worker: WorkerState) -> float:
    """Seed 000's router weight for a worker that holds nothing useful: 1 - (used/total)^2."""
    return 1.0 - worker.mem_ratio**2


def choose_worker(
    workers: Sequence[WorkerState],
    block_hashes: Sequence[str],
    threshold: float = MEMORY_THRESHOLD,
) -> str | None:
    """The ready worker holding the longest prefix of `block_hashes`, else the least loaded.

    Workers whose pinned (unevictable) share is above the threshold take no new warmup;
    evictable request-cache KV makes room for a warmup, so it does not count there. Ties go
    to the lower id, so the choice is deterministic and testable.
    """
    eligible = [w for w in workers if w.ready and w.warm_ratio <= threshold]
    if not eligible:
        return None
    best_len, best = 0, None
    for w in sorted(eligible, key=lambda w: w.worker_id):
        held = set(w.prefixes)
        length = max((i + 1 for i, h in enumerate(block_hashes) if h in held), default=0)
        if length > best_len:
            best_len, best = length, w.worker_id
    if best is not None:
        return best
    return max(sorted(eligible, key=lambda w: w.worker_id), key=cold_weight).worker_id


Epoch = Literal["same", "new", "old", "future"]


@dataclass(frozen=True)
class EpochCheck:
    """What bounds a boot epoch (a worker's start, wall-clock microseconds): the receiver's
    wall clock, how far ahead of it an epoch may be (clock skew), and whether the row's
    worker went quiet (no event within the heartbeat horizon)."""

    now_us: int
    ahead_us: int
    expired: bool = False


def epoch_order(state: WorkerState | None, event: WorkerEvent,
                check: EpochCheck | None = None) -> Epoch:
    """Whether an event comes from the boot the row describes, a later one (the worker
    restarted: its cache is gone), or an earlier one (a leftover: ignore it). A v1 worker
    reports no epoch and is always the same boot.

    With `check`: an epoch too far ahead of this clock is "future" (refused: one such
    event made every later, honest epoch look old and locked the worker out of routing
    for good), a row holding such an epoch (written before) is replaced by the next honest
    boot, and a worker whose events stopped may come back (ready or heartbeat) with a
    smaller epoch (its clock stepped back, or another process took the id)."""
    if event.epoch is None:
        return "same"
    if check is not None and event.epoch > check.now_us + check.ahead_us:
        return "future"
    if state is None or state.epoch is None or event.epoch > state.epoch:
        return "new"
    if event.epoch == state.epoch:
        return "same"
    if check is not None and (
        state.epoch > check.now_us + check.ahead_us
        or (check.expired and event.kind in ("ready", "heartbeat"))
    ):
        return "new"
    return "old"


def apply_worker_event(state: WorkerState | None, event: WorkerEvent, now: float,
                       order: Epoch | None = None) -> WorkerState:
    """The worker's row after one of its events; a new boot starts from an empty row, an
    event of an older boot (or from the future) changes nothing; `order`: as the caller
    found it (`epoch_order` with its check), else without bounds."""
    order = order or epoch_order(state, event)
    if state is not None and order in ("old", "future"):
        return state
    if order == "new":
        state = WorkerState(worker_id=event.worker_id, url=state.url if state else None)
    ws = state or WorkerState(worker_id=event.worker_id)
    if event.epoch is not None:
        ws = ws.model_copy(update={"epoch": event.epoch})
    if event.node is not None:
        ws = ws.model_copy(update={"node": event.node})
    update: dict = {"last_seen": now}
    if event.url:
        update["url"] = event.url
    if event.kind in ("ready", "heartbeat"):
        update.update(
            ready=True,
            mem_used=event.mem_used_bytes,
            mem_total=event.mem_total_bytes,
            pinned=event.pinned_bytes,
            entries=event.entries,
            tier_bytes=event.tier_bytes,
            tier_total=event.tier_total_bytes,
        )
        if event.kind == "heartbeat" or event.warm_prefixes or event.tier_prefixes:
            # A v3 worker's disk tier survived its restart: it serves those prefixes too.
            held = dict.fromkeys([*event.warm_prefixes, *event.tier_prefixes])
            update["prefixes"] = list(held)
    elif event.kind == "stopped":
        update.update(ready=False, prefixes=[])
    elif event.kind == "cleared":
        update["prefixes"] = []
    elif event.prefix_hash and event.kind == "stored":
        update["prefixes"] = [
            *[p for p in ws.prefixes if p != event.prefix_hash],
            event.prefix_hash,
        ]
    elif event.prefix_hash and event.kind in ("evicted", "invalidated"):
        update["prefixes"] = [p for p in ws.prefixes if p != event.prefix_hash]
    if event.kind not in ("ready", "heartbeat", "stopped") and event.mem_total_bytes:
        update.update(
            mem_used=event.mem_used_bytes,
            mem_total=event.mem_total_bytes,
            pinned=event.pinned_bytes,
        )
    return ws.model_copy(update=update)


Folded = Literal["unauthenticated", "same", "new", "old", "future"]


def fold_worker_event(prior: WorkerState | None, event: WorkerEvent, now: float,
                      check: EpochCheck | None, master: str | None,
                      ) -> tuple[Folded, WorkerState | None]:
    """How one `worker.events` record changes a worker's row: whether it counts (signed
    under `master` when there is one; of this boot or a later one) and the row after it
    (None when it is ignored). The streams app's table and the gateway's own view fold
    events through this one function, so they agree on what every worker holds."""
    if master is not None and not authentic_under_master(event, master):
        # A forged heartbeat would otherwise set the URL clients are routed to.
        return "unauthenticated", None
    order = epoch_order(prior, event, check)
    if order in ("old", "future"):
        return order, None
    return order, apply_worker_event(prior, event, now, order)


def mark_stale(rows: Iterable[WorkerState], now: float, stale_s: float) -> list[WorkerState]:
    """The rows with every worker not heard from within `stale_s` marked not ready."""
    horizon = now - stale_s
    return [w if w.last_seen >= horizon else w.model_copy(update={"ready": False})
            for w in rows]


def route_answer(workers: Sequence[WorkerState], hashes: Sequence[str]) -> dict:
    """Where to send a prompt of these block hashes: the chosen worker, how many leading
    blocks it holds, and every ready worker (the `/ragwarm/route` body)."""
    live = [w for w in workers if w.ready and w.url]
    # Serving is not warmup: a busy worker still serves, so no memory threshold here.
    chosen = choose_worker(live, list(hashes), threshold=1.0)
    by_id = {w.worker_id: w for w in live}
    matched = 0
    if chosen:
        held = set(by_id[chosen].prefixes)
        matched = max((i + 1 for i, h in enumerate(hashes) if h in held), default=0)
    return {
        "worker_id": chosen,
        "url": by_id[chosen].url if chosen else None,
        "matched_blocks": matched,
        "workers": [{"worker_id": w.worker_id, "url": w.url} for w in live],
    }


# Seed 000, deployment: "keep ≥1 hot instance per node".
MIN_HOT_PER_NODE = 1


def hot_targets(
    prefix_hash: str,
    workers: Sequence[WorkerState],
    threshold: float = MEMORY_THRESHOLD,
    per_node: int = MIN_HOT_PER_NODE,
) -> list[str]:
    """The ready workers a hot prefix must be warmed on so `per_node` of every node hold it.

    A node whose workers hold it already needs nothing; otherwise its eligible workers
    (ready, pinned share within the threshold) with the most room (the cold weight) take
    it, ties to the lower id. A node losing its holder (a restart, an eviction) then still
    serves the hot set without crossing to another machine, and one node's failure leaves
    the others hot. Workers that report no node (before v4 events) count as one node.
    """
    by_node: dict[str | None, list[WorkerState]] = {}
    for w in workers:
        if w.ready:
            by_node.setdefault(w.node, []).append(w)
    targets: list[str] = []
    for node in sorted(by_node, key=lambda n: n or ""):
        group = sorted(by_node[node], key=lambda w: w.worker_id)
        missing = per_node - sum(prefix_hash in w.prefixes for w in group)
        free = [w for w in group if prefix_hash not in w.prefixes and w.warm_ratio <= threshold]
        free.sort(key=cold_weight, reverse=True)  # stable: equal weights keep id order
        targets.extend(w.worker_id for w in free[: max(0, missing)])
    return targets
