"""A watchdog over Faust's table recovery: an active changelog partition that stops
receiving records while still behind its highwater is sought again from where its table
stands.

Why: after a takeover, Faust rebuilds each active table partition from its changelog
(memory stores: from offset 0) and keeps every stream partition paused until all of them
reach their highwaters. In rare takeovers under load the fetcher returned nothing more for
some of those partitions (lab/2026-12-07-takeover-stall.md): Faust logged "No event
received for active tp" every 5 s and the instance handled no KB change or query for about
five minutes. Faust itself never seeks again during a recovery; it only warns. A seek to
the next offset the table lacks is what Faust does at the start of a recovery, so it is
safe to repeat: records the table already holds are skipped by offset.

Each repair is logged with what the consumer held for the partition (its fetch position,
whether Faust or aiokafka had it paused or buffered), counted (`recovery_reseeks`), and
repeated at most once per quiet period.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

log = logging.getLogger(__name__)


def stalled(
    now: float,
    started_at: float,
    received_at: Mapping[Any, float],
    sought_at: Mapping[Any, float],
    offsets: Mapping[Any, int | None],
    highwaters: Mapping[Any, int | None],
    quiet_s: float,
) -> dict[Any, int]:
    """The active partitions still behind their highwater that got no record (nor a seek
    from here) for `quiet_s`, each with the offset to seek it to: the one after the last
    record applied (Faust starts a memory table's offset at -1, so 0 for none)."""
    out = {}
    for tp, highwater in highwaters.items():
        offset = offsets.get(tp)
        if highwater is None or offset is None or offset >= highwater:
            continue
        last = max(started_at, received_at.get(tp, started_at), sought_at.get(tp, started_at))
        if now - last >= quiet_s:
            out[tp] = max(offset + 1, 0)
    return out


class RecoveryWatch:
    """Checks Faust's recovery every `quiet_s / 2` while it runs and re-seeks its stalled
    active partitions; `stats` gets `recovery_reseeks` and `recovery_stalls` (recoveries
    in which at least one partition stalled)."""

    def __init__(
        self, app: Any, quiet_s: float, stats: MutableMapping[str, int],
        clock: Callable[[], float],
    ) -> None:
        self.app = app
        self.quiet_s = quiet_s
        self.stats = stats
        self.clock = clock
        self._sought_at: dict[Any, float] = {}
        self._recovery: float | None = None  # start of the recovery last checked

    async def check(self) -> dict[Any, int]:
        """Re-seek what stalled in the recovery under way (nothing when none runs)."""
        recovery = self.app.tables.recovery
        started = getattr(recovery, "_recovery_started_at", None)
        if not recovery.in_recovery or started is None:
            return {}
        if started != self._recovery:  # a new recovery: earlier seeks do not count
            self._recovery, self._sought_at = started, {}
        now = self.clock()
        seeks = stalled(
            now, started, recovery._active_events_received_at, self._sought_at,
            recovery.active_offsets,
            {tp: hw for tp, hw in recovery.active_highwaters.items()
             if tp in recovery.active_tps},
            self.quiet_s,
        )
        if not seeks:
            return {}
        first = not self._sought_at
        consumer = self.app.consumer
        log.warning(
            "table recovery: no record for %.0f s on %d active changelog partition(s) behind "
            "their highwater; seeking them again (flow_active=%s): %s",
            self.quiet_s, len(seeks), consumer.flow_active,
            "; ".join(await _describe(consumer, recovery, seeks)),
        )
        try:
            consumer.resume_partitions(set(seeks))
            await consumer.seek_wait(seeks)
        except Exception as exc:  # noqa: BLE001 - a rebalance took them: the next one seeks
            log.warning("table recovery: seeking again failed (%s: %s); a rebalance under "
                        "way restarts the recovery", type(exc).__name__, exc)
            return {}
        for tp in seeks:
            self._sought_at[tp] = now
        if first:
            self.stats["recovery_stalls"] += 1
        self.stats["recovery_reseeks"] += len(seeks)
        return seeks


async def _describe(consumer: Any, recovery: Any, seeks: Mapping[Any, int]) -> list[str]:
    """Per partition what the consumer held: the facts that tell why no record came."""
    inner = getattr(getattr(getattr(consumer, "_thread", None), "_consumer", None),
                    "_fetcher", None)
    buffered = getattr(inner, "_records", {}) or {}
    out = []
    for tp, offset in sorted(seeks.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        try:
            position = await consumer.position(tp)
        except Exception as exc:  # noqa: BLE001 - a diagnostic only
            position = f"? ({type(exc).__name__})"
        out.append(
            f"{tp[0]}[{tp[1]}] to {offset} (highwater {recovery.active_highwaters.get(tp)}), "
            f"position {position}, paused {tp in getattr(consumer, '_paused_partitions', ())}"
            f", buffered {any(t[0] == tp[0] and t[1] == tp[1] for t in buffered)}"
        )
    return out


def register_recovery_watch(app: Any, quiet_s: float, stats: MutableMapping[str, int]) -> None:
    """Check every recovery every `quiet_s / 2` (0: no watchdog).

    Not a Faust timer: Faust starts timers only once the first recovery has ended, and the
    one at start (a restarted instance rebuilding its tables) needs watching too. The loop
    starts at the first assignment, on the app (stopped with it).
    """
    if quiet_s <= 0:
        return
    watch = RecoveryWatch(app, quiet_s, stats, time.monotonic)
    started: list[Any] = []

    async def watch_loop() -> None:
        while True:
            await asyncio.sleep(quiet_s / 2)
            try:
                await watch.check()
            except Exception:  # a diagnostic failing must not end the watch
                log.exception("table recovery watchdog failed")

    async def on_partitions_assigned(*_: Any, **__: Any) -> None:
        if not started:
            started.append(app.add_future(watch_loop()))

    app.on_partitions_assigned.connect(on_partitions_assigned)
