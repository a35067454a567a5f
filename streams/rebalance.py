"""After every rebalance, each assigned partition starts at its committed offset, or at its
beginning when nothing was committed for it yet.

Why: on revocation Faust drops the records it had fetched but not yet handed to an agent,
and after the new assignment it seeks every partition to its committed offset, counting on
that to fetch them again. aiokafka's `seek_to_committed` skips a partition with no committed
offset (`if offset and offset > 0`), so a partition an instance keeps across a rebalance
before its first commit stays where the fetcher left it, past the dropped records: they are
never handled, and its committed offset never passes them. Seen with `bench pipeline
--streams 2`: the first instance fetched all of kb.changes, the second joined while the
first batch ran, and the instance left with partitions 2-3 sat at offsets 8/12 and 8/16 for
good (fetch position at the end, nothing queued, no CPU).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
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


def register_rebalance_seek(app: Any) -> None:
    """Seek the uncommitted partitions to their beginning when a rebalance completes, before
    Faust seeks the others to their committed offsets and resumes the flow."""

    async def seek_uncommitted(sender: Any = None, **_: Any) -> None:
        consumer = app.consumer
        try:
            assigned = consumer.assignment()
            if not assigned:  # aiokafka asserts on an empty assignment
                return
            committed = await consumer.seek_to_committed()
            for tp in uncommitted(assigned, committed, app.tables.changelog_topics):
                # 0 is the beginning (the consumer's reset policy is earliest): a log start
                # moved past it by retention is reset to the new start.
                await consumer.seek(tp, 0)
        except Exception:  # noqa: BLE001 - never fail Faust's recovery; the next one retries
            log.exception("rebalance: could not seek the uncommitted partitions")

    app.on_rebalance_complete.connect(seek_uncommitted)
