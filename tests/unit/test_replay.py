"""Replay planning: parsing --from/--to, resolving them per partition, refusing live groups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from ragwarm.kafka.replay_plan import (
    Bounds,
    PartitionPlan,
    Position,
    before_now,
    check_range,
    group_refusal,
    parse_duration,
    parse_position,
    plan_partitions,
    plan_table,
    resolve,
    shift,
)

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("beginning", Position("beginning")),
        ("earliest", Position("beginning")),
        ("END", Position("end")),
        ("latest", Position("end")),
        ("0", Position("offset", 0)),
        ("1234", Position("offset", 1234)),
        ("2026-01-01T00:00:00Z", Position("time", T0_MS)),
        ("2026-01-01T00:00:00+00:00", Position("time", T0_MS)),
        ("2026-01-01T01:00:00+01:00", Position("time", T0_MS)),
        ("2026-01-01T00:00:00.250Z", Position("time", T0_MS + 250)),
        ("2026-01-01", Position("time", T0_MS)),
        ("1960-01-01T00:00:00Z", Position("time", 0)),
    ],
)
def test_parse_position(text: str, expected: Position) -> None:
    assert parse_position(text) == expected


def test_a_time_without_zone_is_utc() -> None:
    assert parse_position("2026-01-01T00:00:00") == Position("time", T0_MS)


@pytest.mark.parametrize("text", ["", "-5", "yesterday", "12ab", "2026-13-01"])
def test_parse_position_rejects_other_text_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="'beginning', 'end', an offset or an ISO-8601 time"):
        parse_position(text)


def test_position_prints_readably() -> None:
    assert str(Position("time", T0_MS)) == "2026-01-01T00:00:00.000+00:00"
    assert str(Position("offset", 7)) == "offset 7"
    assert str(Position("beginning")) == "beginning"


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (Position("offset", 5), Position("offset", 3)),
        (Position("time", T0_MS), Position("time", T0_MS - 1)),
        (Position("end"), Position("offset", 3)),
        (Position("offset", 0), Position("beginning")),
    ],
)
def test_check_range_refuses_ranges_empty_by_construction(start: Position, end: Position) -> None:
    with pytest.raises(ValueError):
        check_range(start, end)


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (Position("beginning"), Position("end")),
        (Position("offset", 3), Position("offset", 3)),
        (Position("time", T0_MS), Position("offset", 2)),  # decided per partition
        (Position("end"), Position("end")),
    ],
)
def test_check_range_accepts(start: Position, end: Position) -> None:
    check_range(start, end)


BOUNDS = Bounds(partition=0, earliest=10, latest=50)


@pytest.mark.parametrize(
    ("position", "at_time", "expected"),
    [
        (Position("beginning"), None, 10),
        (Position("end"), None, 50),
        (Position("offset", 20), None, 20),
        (Position("offset", 3), None, 10),  # deleted by retention: the first kept record
        (Position("offset", 99), None, 50),
        (Position("time", T0_MS), 30, 30),
        (Position("time", T0_MS), None, 50),  # no record at or after the time
        (Position("time", T0_MS), -1, 50),
    ],
)
def test_resolve(position: Position, at_time: int | None, expected: int) -> None:
    assert resolve(position, BOUNDS, at_time) == expected


def test_plan_per_partition_from_times_and_offsets() -> None:
    bounds = [Bounds(1, 0, 8), Bounds(0, 0, 10), Bounds(2, 0, 0)]
    at_times = {(0, T0_MS): 4, (1, T0_MS): None, (2, T0_MS): None}
    plans = plan_partitions(bounds, Position("time", T0_MS), Position("end"), at_times, {0: 10})
    assert plans == [
        PartitionPlan(0, 4, 10, committed=10),
        PartitionPlan(1, 8, 8),
        PartitionPlan(2, 0, 0),
    ]
    assert [p.count for p in plans] == [6, 0, 0]


def test_plan_between_two_times() -> None:
    bounds = [Bounds(0, 0, 10), Bounds(1, 0, 10)]
    at_times = {(0, 1): 2, (0, 2): 7, (1, 1): 5, (1, 2): None}
    plans = plan_partitions(bounds, Position("time", 1), Position("time", 2), at_times)
    assert [(p.start, p.end, p.count) for p in plans] == [(2, 7, 5), (5, 10, 5)]


def test_plan_end_before_start_on_a_partition_is_empty() -> None:
    plans = plan_partitions(
        [Bounds(0, 0, 10)], Position("offset", 6), Position("time", 9), {(0, 9): 2}
    )
    assert plans == [PartitionPlan(0, 6, 6)]


positions = st.one_of(
    st.sampled_from([Position("beginning"), Position("end")]),
    st.builds(Position, st.just("offset"), st.integers(0, 200)),
    st.builds(Position, st.just("time"), st.integers(0, 3)),
)


@given(
    spans=st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=6),
    start=positions,
    end=positions,
    answers=st.lists(st.one_of(st.none(), st.integers(0, 150)), min_size=24, max_size=24),
)
def test_plans_stay_inside_the_log(spans, start, end, answers) -> None:
    bounds = [Bounds(i, min(a, b), max(a, b)) for i, (a, b) in enumerate(spans)]
    at_times = {(p, t): answers[p * 4 + t] for p in range(len(bounds)) for t in range(4)}
    for plan, b in zip(plan_partitions(bounds, start, end, at_times), bounds, strict=True):
        assert b.earliest <= plan.start <= plan.end <= b.latest
        assert plan.count == plan.end - plan.start >= 0


def test_group_refusal_lets_stopped_groups_through() -> None:
    assert group_refusal("g", {"group_state": "Empty", "members": []}) is None
    assert group_refusal("g", {"group_state": "Dead", "members": []}) is None


@pytest.mark.parametrize(
    "description",
    [
        {"group_state": "Stable", "members": [{"member_id": "m1"}]},
        {"group_state": "PreparingRebalance", "members": []},
        {"group_state": "Empty", "members": [{"member_id": "m1"}]},
        {},
    ],
)
def test_group_refusal_names_the_group_and_what_to_do(description: dict) -> None:
    message = group_refusal("streams", description)
    assert message is not None
    assert "'streams'" in message and "stop its consumers" in message


def test_plan_table_has_a_row_per_partition_and_a_total() -> None:
    lines = plan_table([PartitionPlan(0, 4, 10, 12), PartitionPlan(1, 0, 3)], with_committed=True)
    assert lines[0].split() == ["partition", "from", "to", "records", "committed"]
    assert lines[1].split() == ["0", "4", "10", "6", "12"]
    assert lines[2].split() == ["1", "0", "3", "3", "-"]
    assert lines[3].split() == ["total", "9"]


def test_time_position_of_a_datetime_round_trips() -> None:
    moment = datetime(2026, 3, 4, 5, 6, 7, 891000, tzinfo=UTC)
    assert parse_position(moment.isoformat()) == Position("time", int(moment.timestamp() * 1000))


# --- --by-duration and --shift-by ------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT1H", timedelta(hours=1)),
        ("pt30m", timedelta(minutes=30)),
        ("P1DT12H", timedelta(days=1, hours=12)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("P2W", timedelta(weeks=2)),
        ("1h", timedelta(hours=1)),
        ("90m", timedelta(minutes=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("2d", timedelta(days=2)),
        ("45s", timedelta(seconds=45)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "P", "PT", "1x", "h", "1h 30m", "-1h", "yesterday"])
def test_parse_duration_rejects_other_text_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="PT1H"):
        parse_duration(text)


def test_by_duration_is_a_time_before_now() -> None:
    now = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
    assert before_now(timedelta(hours=1), now) == Position("time", T0_MS)
    assert before_now(timedelta(days=100_000), now) == Position("time", 0)


@pytest.mark.parametrize(
    ("records", "committed", "expected"),
    [(-5, 30, 25), (5, 30, 35), (-50, 30, 10), (50, 30, 50), (0, 30, 30)],
)
def test_shift_moves_the_committed_offset_inside_the_log(
    records: int, committed: int, expected: int
) -> None:
    assert resolve(shift(records), BOUNDS, committed=committed) == expected


def test_a_shift_needs_a_committed_offset_on_every_partition() -> None:
    bounds = [Bounds(0, 0, 10), Bounds(1, 0, 10), Bounds(2, 0, 10)]
    with pytest.raises(ValueError, match=r"partition\(s\) 0, 2 have none"):
        plan_partitions(bounds, shift(-3), Position("end"), committed={1: 8})
    plans = plan_partitions(bounds, shift(-3), Position("end"), committed={0: 2, 1: 8, 2: 10})
    assert [(p.start, p.end, p.committed) for p in plans] == [(0, 10, 2), (5, 10, 8), (7, 10, 10)]


def test_a_shift_cannot_end_a_range_and_prints_readably() -> None:
    with pytest.raises(ValueError, match="cannot end a range"):
        check_range(Position("beginning"), shift(3))
    assert str(shift(-3)) == "committed offset -3"
    assert str(shift(4)) == "committed offset +4"


@given(
    spans=st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=6),
    records=st.integers(-300, 300),
    commits=st.lists(st.integers(0, 100), min_size=6, max_size=6),
)
def test_shifted_plans_stay_inside_the_log(spans, records, commits) -> None:
    bounds = [Bounds(i, min(a, b), max(a, b)) for i, (a, b) in enumerate(spans)]
    committed = dict(enumerate(commits))
    for plan, b in zip(plan_partitions(bounds, shift(records), Position("end"),
                                       committed=committed), bounds, strict=True):
        assert b.earliest <= plan.start <= plan.end == b.latest


# --- the command's choices, refused before any broker is asked ------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["t", "--group", "g"], "exactly one of --from, --by-duration or --shift-by"),
        (["t", "--group", "g", "--from", "beginning", "--shift-by", "-2"],
         "(got --from and --shift-by)"),
        (["t", "--into", "u", "--shift-by", "-2"], "--shift-by moves a group's committed offsets"),
        (["t", "--group", "g", "--by-duration", "soon"], "is not a duration"),
        (["t", "--group", "g", "--from", "beginning", "--execute", "--dry-run"], "contradict"),
        (["t", "--from", "beginning", "--evaluate", "lru", "--execute"], "--evaluate only reads"),
    ],
)
def test_replay_refuses_contradictory_choices(args: list[str], message: str) -> None:
    from ragwarm.cli.replay import replay

    result = CliRunner().invoke(replay, args)
    assert result.exit_code == 2
    assert message in result.output
