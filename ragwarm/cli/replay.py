"""`ragwarm replay`: rewind a stopped consumer group, copy a range, or evaluate a policy offline."""

from __future__ import annotations

from typing import Any

import click

from ragwarm.kafka.common import quiet_client_logs
from ragwarm.kafka.replay import run_copy, run_reset
from ragwarm.kafka.replay_plan import Position, check_range, parse_position
from ragwarm.settings import KafkaSettings


class _PositionType(click.ParamType):
    name = "position"

    def convert(self, value: Any, param: Any, ctx: Any) -> Position:
        if isinstance(value, Position):
            return value
        try:
            return parse_position(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)



@click.command()
@click.argument("topic")
@click.option(
    "--from",
    "start",
    type=_PositionType(),
    required=True,
    help="ISO-8601 time, offset (same on every partition) or 'beginning'.",
)
@click.option(
    "--to",
    "end",
    type=_PositionType(),
    default=None,
    help="Copy mode: stop before this ISO time or offset, or at the 'end' (default).",
)
@click.option("--group", help="Reset this stopped consumer group's offsets on TOPIC to --from.")
@click.option("--into", help="Copy [--from, --to) of TOPIC into this topic (created if missing).")
@click.option("--dry-run", is_flag=True, help="Print the plan per partition; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan and result as JSON.")
@click.option("--evaluate", metavar="POLICY",
              help="Replay the query events of the range offline against a warmup policy.")
def replay(
    topic: str,
    start: Position,
    end: Position | None,
    group: str | None,
    into: str | None,
    dry_run: bool,
    as_json: bool,
    evaluate: str | None = None,
) -> None:
    """Replay TOPIC: rewind a stopped consumer group (--group), copy a range (--into), or
    replay logged queries against a warmup policy (--evaluate).

    A time maps, per partition, to the first record at or after it (the end of the log
    when there is none); offsets are kept inside what the log still holds.
    """
    quiet_client_logs()
    if evaluate is not None:
        from ragwarm.bench.strategies.evaluate import run_evaluate

        if group or into or dry_run:
            raise click.UsageError("--evaluate only reads: no --group, --into or --dry-run")
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
    settings = KafkaSettings()
    if group is not None:
        run_reset(settings, topic, group, start, dry_run, as_json)
    else:
        run_copy(settings, topic, into, start, end, dry_run, as_json)  # type: ignore[arg-type]


