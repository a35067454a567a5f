"""`ragwarm replay`: rewind a stopped consumer group, copy a range, or evaluate a policy offline.

Like `kafka-consumer-groups --reset-offsets`, it prints the plan and changes nothing unless
given --execute.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import click

from ragwarm.cli.tree import tree_of
from ragwarm.kafka.common import quiet_client_logs
from ragwarm.kafka.replay import run_copy, run_reset
from ragwarm.kafka.replay_plan import (
    Position,
    before_now,
    check_range,
    parse_duration,
    parse_position,
    shift,
)


class _PositionType(click.ParamType):
    name = "position"

    def convert(self, value: Any, param: Any, ctx: Any) -> Position:
        if isinstance(value, Position):
            return value
        try:
            return parse_position(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)



class _DurationType(click.ParamType):
    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command()
@click.argument("topic")
@click.option(
    "--from",
    "start",
    type=_PositionType(),
    default=None,
    help="ISO-8601 time, offset (same on every partition) or 'beginning'.",
)
@click.option("--by-duration", "ago", type=_DurationType(), default=None,
              help="Instead of --from: the time this long ago (PT1H, P1DT12H, 1h, 90m).")
@click.option("--shift-by", "shift_by", type=int, default=None,
              help="Instead of --from, with --group: move each partition's committed offset "
              "by N records (negative: back).")
@click.option(
    "--to",
    "end",
    type=_PositionType(),
    default=None,
    help="Copy mode: stop before this ISO time or offset, or at the 'end' (default).",
)
@click.option("--group", help="Reset this stopped consumer group's offsets on TOPIC to the start "
              "(--from, --by-duration or --shift-by).")
@click.option("--into", help="Copy [--from, --to) of TOPIC into this topic (created if missing).")
@click.option("--execute", is_flag=True,
              help="Apply the plan. Without it replay prints the plan and changes nothing, "
              "as kafka-consumer-groups --reset-offsets does.")
@click.option("--dry-run", is_flag=True, help="Print the plan only (the default).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan and result as JSON.")
@click.option("--evaluate", metavar="POLICY",
              help="Replay the query events of the range offline against a warmup policy.")
def replay(
    topic: str,
    start: Position | None,
    ago: timedelta | None,
    shift_by: int | None,
    end: Position | None,
    group: str | None,
    into: str | None,
    execute: bool,
    dry_run: bool,
    as_json: bool,
    evaluate: str | None = None,
) -> None:
    """Replay TOPIC: rewind a stopped consumer group (--group), copy a range (--into), or
    replay logged queries against a warmup policy (--evaluate).

    Dry run by default: the plan per partition is printed and nothing changes until the
    same command is run again with --execute.

    A time maps, per partition, to the first record at or after it (the end of the log
    when there is none); offsets are kept inside what the log still holds.
    """
    quiet_client_logs()
    start = _start(start, ago, shift_by, group)
    if execute and dry_run:
        raise click.UsageError("--execute and --dry-run contradict each other")
    if evaluate is not None:
        from ragwarm.bench.strategies.evaluate import run_evaluate

        if group or into or execute or dry_run:
            raise click.UsageError(
                "--evaluate only reads: no --group, --into, --execute or --dry-run")
        return run_evaluate(topic, start, end or Position("end"), evaluate, as_json)
    if (group is None) == (into is None):
        raise click.UsageError("give exactly one of --group G or --into TOPIC2")
    if group is not None and end is not None and end.kind != "end":
        raise click.UsageError("--to applies to --into; a group reads on from --from")
    if into == topic:
        raise click.UsageError("--into must name another topic than TOPIC")
    end = end or Position("end")
    try:
        check_range(start, end)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    settings = tree_of().kafka
    if group is not None:
        run_reset(settings, topic, group, start, not execute, as_json)
    else:
        run_copy(settings, topic, into, start, end, not execute, as_json)  # type: ignore[arg-type]


def _start(
    start: Position | None, ago: timedelta | None, shift_by: int | None, group: str | None
) -> Position:
    """The one start position among --from, --by-duration and --shift-by."""
    given = [name for name, v in (("--from", start), ("--by-duration", ago),
                                  ("--shift-by", shift_by)) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --from, --by-duration or --shift-by"
                               + (f" (got {' and '.join(given)})" if given else ""))
    if shift_by is not None:
        if group is None:
            raise click.UsageError("--shift-by moves a group's committed offsets: give --group")
        return shift(shift_by)
    if ago is not None:
        return before_now(ago, datetime.now(UTC))
    return start  # type: ignore[return-value]
