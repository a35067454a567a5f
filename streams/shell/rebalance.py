"""After every rebalance, each assigned partition starts at its committed offset, or at its
beginning when nothing was committed for it yet, and no record fetched while Faust brings
the stream partitions back is dropped.

Why, two defects of Faust with aiokafka that each left `kb.changes` partitions behind for
good with `bench pipeline --streams 2` (issue 14; the committed offset stops short of the
end, the fetch position sits at the end, nothing is queued, no CPU):

1. Faust drops the records it fetched but had not handed to an agent (at a revocation, or
   when a fetch returns while the flow is stopped) and counts on seeking every partition
   to its committed offset to fetch them again. aiokafka's `seek_to_committed` skips a
   partition with no committed offset (`if offset and offset > 0`), so such a partition
   stays where the fetcher left it, past the dropped records. So every seek to the
   committed offsets also seeks the uncommitted partitions to their beginning.
2. When a rebalance completes with tables, Faust has already resumed the flow (to read the
   changelogs); it then resumes the stream partitions, seeks them to their committed
   offsets (one broker round trip per partition) and only then calls
   `flow_control.resume()`, which empties every stream's queue. Records fetched in that
   window went into the queues and were emptied out of them, with the fetch position
   already past them: seen with the partitions at committed 8 (or nothing committed),
   read offset reset to 8 (None), fetch position at the end, every record of the window
   logged as delivered (generation of the new assignment) and none handled. So the
   consumer's flow is stopped when the rebalance completes: nothing is fetched until Faust
   resumes it after its seek, and a fetch that returns meanwhile is dropped and sought
   back by Faust (through 1., the uncommitted partitions too).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

log = logging.getLogger(__name__)

TP = TypeVar("TP", bound=tuple)  # a (topic, partition) named tuple: Faust's TP, aiokafka's


def uncommitted(
    assigned: Iterable[TP], committed: Mapping[Any, int | None], skip_topics: Collection[str]
) -> list[TP]:
    """The assigned partitions, outside `skip_topics` (the changelogs, which table recovery
    positions itself), with no committed offset: to be sought to their beginning. An offset
    of 0 counts as none (aiokafka does not seek to it either)."""
    return sorted(
        (tp for tp in assigned if tp[0] not in skip_topics and not committed.get(tp)),
        key=lambda tp: (tp[0], tp[1]),
    )


def seeking_uncommitted_too(
    seek_to_committed: Callable[[], Awaitable[Mapping[Any, int | None]]],
    assignment: Callable[[], Iterable[Any]],
    seek: Callable[[Any, int], Awaitable[None]],
    skip_topics: Callable[[], Collection[str]],
) -> Callable[[], Awaitable[Mapping[Any, int | None]]]:
    """`seek_to_committed` that then seeks the uncommitted partitions to their beginning
    (0: the consumer's reset policy is earliest, so a log start moved past it by retention
    is reset to the new start). Returns what `seek_to_committed` returned: Faust sets its
    read offsets from it, None (read from anywhere) for these partitions."""

    async def seek_all() -> Mapping[Any, int | None]:
        committed = await seek_to_committed()
        for tp in uncommitted(assignment(), committed, skip_topics()):
            await seek(tp, 0)
        return committed

    return seek_all


def flow_state(app: Any) -> dict[str, Any]:
    """The consumer's flow as an operator needs it to tell a stalled instance: whether it
    fetches (`flow_active`), whether a rebalance is under way, whether tables are being
    rebuilt from their changelogs (`recovering`: the stream partitions wait for it), and its
    assigned and paused partitions (with none assigned yet, or before the consumer starts:
    zeros)."""
    flags = {"rebalancing": bool(app.rebalancing),
             "recovering": bool(getattr(app, "in_recovery", False))}
    consumer = getattr(app, "_consumer", None)
    if consumer is None:
        return {"flow_active": False, **flags, "assigned": 0, "paused": 0}
    try:
        assigned = len(consumer.assignment())
    except Exception:  # noqa: BLE001 - not started yet
        assigned = 0
    return {
        "flow_active": bool(consumer.flow_active),
        **flags,
        "assigned": assigned,
        "paused": len(getattr(consumer, "_paused_partitions", ())),
    }


def register_rebalance_seek(app: Any) -> None:
    """When a rebalance completes (before Faust resumes the stream partitions, seeks them
    and resumes the flow): stop the consumer's flow, and make every later seek to the
    committed offsets cover the uncommitted partitions."""

    async def on_rebalance_complete(sender: Any = None, **_: Any) -> None:
        consumer = app.consumer
        # Faust resumes it once its seek is done (`consumer.resume_flow()`).
        consumer.stop_flow()
        if not getattr(consumer, "_ragwarm_seeks_uncommitted", False):
            # On the instance: Faust's `perform_seek` (after a rebalance, and when a fetch
            # returns while the flow is stopped) calls `self.seek_to_committed()`.
            consumer.seek_to_committed = seeking_uncommitted_too(
                consumer.seek_to_committed,
                consumer.assignment,
                consumer.seek,
                lambda: app.tables.changelog_topics,
            )
            consumer._ragwarm_seeks_uncommitted = True

    app.on_rebalance_complete.connect(on_rebalance_complete)
