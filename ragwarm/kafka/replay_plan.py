"""Replay planning, pure: positions (--from/--to), per-partition ranges, group refusals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ragwarm.kafka.common import epoch_ms

Kind = Literal["beginning", "end", "offset", "time"]
_WORDS: dict[str, Kind] = {
    "beginning": "beginning",
    "earliest": "beginning",
    "end": "end",
    "latest": "end",
}
# States in which a classic consumer group has no member that could commit over a reset.
STOPPED_STATES = frozenset({"Empty", "Dead"})


@dataclass(frozen=True)
class Position:
    """Where a range starts or ends: a named end of the log, an offset, or a time (ms)."""

    kind: Kind
    value: int | None = None

    def __str__(self) -> str:
        if self.kind == "offset":
            return f"offset {self.value}"
        if self.kind == "time":
            stamp = datetime.fromtimestamp(self.value / 1000, UTC)  # type: ignore[operator]
            return stamp.isoformat(timespec="milliseconds")
        return self.kind


def parse_position(text: str) -> Position:
    """`beginning`/`earliest`, `end`/`latest`, a non-negative offset, or an ISO-8601 time.

    A time without a zone is read as UTC, as the trace reader does.
    """
    word = text.strip().lower()
    if word in _WORDS:
        return Position(_WORDS[word])
    if word.isdigit():
        return Position("offset", int(word))
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is not 'beginning', 'end', an offset or an ISO-8601 time "
            "(e.g. 2026-01-31T12:00:00Z)"
        ) from None
    # Kafka reads negative times as "earliest"/"latest" markers; every record is after 1970.
    return Position("time", max(0, epoch_ms(moment)))


def check_range(start: Position, end: Position) -> None:
    """Refuse a range that is empty by construction (both ends of one kind, end first)."""
    if start.kind == "end" and end.kind != "end":
        raise ValueError("--from end leaves nothing to replay before --to")
    if end.kind == "beginning":
        raise ValueError("--to beginning leaves nothing to replay")
    comparable = start.kind == end.kind and start.kind in ("offset", "time")
    if comparable and end.value < start.value:  # type: ignore[operator]
        raise ValueError(f"--to ({end}) is before --from ({start})")


@dataclass(frozen=True)
class Bounds:
    """A partition's log: first offset still kept, and the offset the next record will get."""

    partition: int
    earliest: int
    latest: int


@dataclass(frozen=True)
class PartitionPlan:
    """Records [start, end) of one partition; `committed` is the group's offset before a reset."""

    partition: int
    start: int
    end: int
    committed: int | None = None

    @property
    def count(self) -> int:
        return self.end - self.start


def resolve(position: Position, bounds: Bounds, at_time: int | None = None) -> int:
    """The offset of `position` in one partition, kept inside the log.

    `at_time` is the first offset whose timestamp is at or after a time position; None
    (no such record) maps to the end of the log.
    """
    if position.kind == "beginning":
        return bounds.earliest
    if position.kind == "end":
        return bounds.latest
    offset = position.value if position.kind == "offset" else at_time
    if offset is None or offset < 0:
        return bounds.latest
    return min(max(offset, bounds.earliest), bounds.latest)


def plan_partitions(
    bounds: Sequence[Bounds],
    start: Position,
    end: Position,
    at_times: Mapping[tuple[int, int], int | None] | None = None,
    committed: Mapping[int, int] | None = None,
) -> list[PartitionPlan]:
    """One plan per partition; `at_times[(partition, time_ms)]` answers time positions."""
    at_times = at_times or {}
    committed = committed or {}
    plans = []
    for b in sorted(bounds, key=lambda b: b.partition):
        first = resolve(start, b, at_times.get((b.partition, start.value or 0)))
        last = resolve(end, b, at_times.get((b.partition, end.value or 0)))
        plans.append(
            PartitionPlan(b.partition, first, max(first, last), committed.get(b.partition))
        )
    return plans


def group_refusal(group: str, description: Mapping[str, Any]) -> str | None:
    """Why a group's offsets must not be reset now (members could overwrite them), or None."""
    state = description.get("group_state") or "Unknown"
    members = description.get("members") or []
    if not members and state in STOPPED_STATES:
        return None
    return (
        f"consumer group {group!r} is {state} with {len(members)} active member(s); stop its "
        "consumers (e.g. the streams app or workers) and run replay again"
    )


def plan_table(plans: Sequence[PartitionPlan], with_committed: bool) -> list[str]:
    head = f"{'partition':>9} {'from':>12} {'to':>12} {'records':>10}"
    lines = [head + (f" {'committed':>12}" if with_committed else "")]
    for p in plans:
        row = f"{p.partition:>9} {p.start:>12} {p.end:>12} {p.count:>10}"
        if with_committed:
            row += f" {'-' if p.committed is None else p.committed:>12}"
        lines.append(row)
    lines.append(f"{'total':>9} {'':>12} {'':>12} {sum(p.count for p in plans):>10}")
    return lines
