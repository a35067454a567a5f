"""Replay planning, pure: positions (--from/--to, --by-duration, --shift-by), per-partition
ranges, group refusals."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from ragwarm.kafka.common import epoch_ms

# "shift": the group's committed offset moved by `value` records (--shift-by).
Kind = Literal["beginning", "end", "offset", "time", "shift"]
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
        if self.kind == "shift":
            return f"committed offset {self.value or 0:+d}"
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


# ISO 8601 as Java's Duration prints it (kafka-consumer-groups --by-duration), with days
# and weeks: P1D, PT1H30M, P1DT12H, PT0.5S.
_ISO = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)
# The short form people type: 1h, 90m, 2d, 1h30m, 45s.
_SHORT = re.compile(r"(?:(?P<n>\d+(?:\.\d+)?)(?P<unit>[wdhms]))", re.IGNORECASE)
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_duration(text: str) -> timedelta:
    """An ISO-8601 duration (`PT1H`, `P1DT12H`) or a short one (`1h`, `90m`, `1h30m`, `2d`)."""
    word = text.strip()
    iso = _ISO.fullmatch(word)
    if iso and word.upper() not in ("P", "PT"):
        parts = {_UNITS[k]: float(v) for k, v in iso.groupdict().items() if v}
        return timedelta(**parts)
    short = list(_SHORT.finditer(word))
    if short and "".join(m.group(0) for m in short) == word:
        total = timedelta()
        for m in short:
            total += timedelta(**{_UNITS[m.group("unit").lower()]: float(m.group("n"))})
        return total
    raise ValueError(
        f"{text!r} is not a duration: give ISO 8601 (PT1H, P1DT12H) or a short form "
        "(1h, 90m, 1h30m, 2d)"
    )


def before_now(duration: timedelta, now: datetime) -> Position:
    """The time position `duration` before `now` (--by-duration)."""
    return Position("time", max(0, epoch_ms(now - duration)))


def shift(records: int) -> Position:
    """The group's committed offset moved by `records` (negative: back), per partition."""
    return Position("shift", records)


def check_range(start: Position, end: Position) -> None:
    """Refuse a range that is empty by construction (both ends of one kind, end first)."""
    if start.kind == "end" and end.kind != "end":
        raise ValueError("--from end leaves nothing to replay before --to")
    if end.kind == "beginning":
        raise ValueError("--to beginning leaves nothing to replay")
    if end.kind == "shift":
        raise ValueError("--shift-by moves where a group starts; it cannot end a range")
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


def resolve(
    position: Position, bounds: Bounds, at_time: int | None = None, committed: int | None = None
) -> int:
    """The offset of `position` in one partition, kept inside the log.

    `at_time` is the first offset whose timestamp is at or after a time position; None
    (no such record) maps to the end of the log. A shift moves `committed`, which it needs.
    """
    if position.kind == "beginning":
        return bounds.earliest
    if position.kind == "end":
        return bounds.latest
    if position.kind == "shift":
        if committed is None:
            raise ValueError(f"partition {bounds.partition} has no committed offset to shift")
        moved = committed + (position.value or 0)
        return min(max(moved, bounds.earliest), bounds.latest)
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
    """One plan per partition; `at_times[(partition, time_ms)]` answers time positions.

    A shift needs a committed offset on every partition, as kafka-consumer-groups does:
    a `ValueError` names the partitions without one.
    """
    at_times = at_times or {}
    committed = committed or {}
    if start.kind == "shift":
        missing = sorted(b.partition for b in bounds if b.partition not in committed)
        if missing:
            raise ValueError(f"--shift-by needs the group's committed offsets; partition(s) "
                             f"{', '.join(map(str, missing))} have none (use --from instead)")
    plans = []
    for b in sorted(bounds, key=lambda b: b.partition):
        at = at_times.get((b.partition, start.value or 0))
        first = resolve(start, b, at, committed.get(b.partition))
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
