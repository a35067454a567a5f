"""`ragwarm replay`: rewind a stopped consumer group, or copy a range of a topic into another."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, TypeVar

import click
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import OffsetSpec, OffsetTimestamp
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, RetriableError
from kafka.structs import OffsetAndMetadata
from tqdm import tqdm

from ragwarm.kafka.common import unreachable_message
from ragwarm.kafka.replay_plan import (
    Bounds,
    PartitionPlan,
    Position,
    group_refusal,
    plan_partitions,
    plan_table,
)
from ragwarm.settings import KafkaSettings

T = TypeVar("T")
DRY_RUN_NOTE = " (dry run: nothing changed; run again with --execute to apply)"


# --- Kafka I/O -------------------------------------------------------------------------------
def _retrying(call: Callable[[], T], attempts: int = 20, pause_s: float = 0.5) -> T:
    # A fresh broker answers CoordinatorNotAvailable until __consumer_offsets has a leader.
    for _ in range(attempts - 1):
        try:
            return call()
        except RetriableError:
            time.sleep(pause_s)
    return call()


def read_bounds(admin: KafkaAdminClient, topic: str) -> list[Bounds] | None:
    """Earliest and latest offsets of every partition, or None if the topic does not exist."""
    if topic not in set(admin.list_topics()):
        return None
    parts = [p["partition_index"] for p in admin.describe_topics([topic])[0]["partitions"]]
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    first = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in tps})
    last = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in tps})
    return [Bounds(tp.partition, first[tp].offset, last[tp].offset) for tp in tps]


def offsets_at_times(
    admin: KafkaAdminClient, topic: str, partitions: Sequence[int], times: Sequence[int]
) -> dict[tuple[int, int], int | None]:
    """First offset at or after each time, per partition (None: no record that late)."""
    found: dict[tuple[int, int], int | None] = {}
    for time_ms in times:
        specs = {TopicPartition(topic, p): OffsetTimestamp(time_ms) for p in partitions}
        for tp, answer in admin.list_partition_offsets(specs).items():
            found[(tp.partition, time_ms)] = answer.offset if answer.offset >= 0 else None
    return found


def committed_offsets(admin: KafkaAdminClient, group: str, topic: str) -> dict[int, int]:
    offsets = _retrying(lambda: admin.list_group_offsets({group: None})).get(group, {})
    return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic}


def reset_group(
    admin: KafkaAdminClient, group: str, topic: str, plans: Sequence[PartitionPlan]
) -> None:
    """Commit each plan's start offset for the group; raise `KafkaError` naming failures."""
    offsets = {
        TopicPartition(topic, p.partition): OffsetAndMetadata(p.start, "", -1) for p in plans
    }
    result = _retrying(lambda: admin.alter_group_offsets(group, offsets))
    failed = {tp.partition: err for tp, err in result.items() if err.errno != 0}
    if failed:
        detail = ", ".join(f"partition {p}: {e.__name__}" for p, e in sorted(failed.items()))
        raise KafkaError(f"could not reset group {group!r} ({detail})")


def copy_range(
    consumer: KafkaConsumer,
    producer: KafkaProducer,
    source: str,
    target: str,
    plans: Sequence[PartitionPlan],
    keep_partitions: bool,
    idle_timeout_s: float = 30.0,
) -> Counter[int]:
    """Copy records [start, end) of each partition with key, value, headers and timestamp.

    With `keep_partitions` a record lands in the same partition number; otherwise the
    producer's key partitioner places it. Raises `KafkaError` if any record fails.
    """
    todo = {TopicPartition(source, p.partition): p for p in plans if p.count > 0}
    copied: Counter[int] = Counter()
    errors: list[BaseException] = []
    consumer.assign(list(todo))
    for tp, plan in todo.items():
        consumer.seek(tp, plan.start)
    bar = tqdm(
        total=sum(p.count for p in plans), desc="copy", unit="rec", file=sys.stderr, disable=None
    )
    with bar:
        last_progress = time.monotonic()
        while todo:
            batch = consumer.poll(timeout_ms=500)
            for tp, records in batch.items():
                sent = _forward(
                    producer, target, tp, records, todo.get(tp), keep_partitions, errors
                )
                copied[tp.partition] += sent
                bar.update(sent)
            last_progress = time.monotonic() if batch else last_progress
            _drop_finished(consumer, todo)
            if todo and time.monotonic() - last_progress > idle_timeout_s:
                raise KafkaError(f"no records from {source} for {idle_timeout_s:.0f} s")
    producer.flush()
    if errors:
        raise KafkaError(f"{len(errors)} records were not written to {target}: {errors[0]!r}")
    return copied


def _forward(
    producer: KafkaProducer,
    target: str,
    tp: TopicPartition,
    records: Sequence[Any],
    plan: PartitionPlan | None,
    keep_partitions: bool,
    errors: list[BaseException],
) -> int:
    sent = 0
    for record in records:
        if plan is None or record.offset >= plan.end:
            break
        future = producer.send(
            target,
            key=record.key,
            value=record.value,
            headers=list(record.headers or []),
            partition=tp.partition if keep_partitions else None,
            timestamp_ms=record.timestamp,
        )
        future.add_errback(errors.append)
        sent += 1
    return sent


def _drop_finished(consumer: KafkaConsumer, todo: dict[TopicPartition, PartitionPlan]) -> None:
    # Positions, not record counts: compaction or transaction markers leave offset gaps.
    for tp in [tp for tp, plan in todo.items() if consumer.position(tp) >= plan.end]:
        consumer.pause(tp)
        del todo[tp]


# --- command ---------------------------------------------------------------------------------
@contextmanager
def admin_session(settings: KafkaSettings) -> Iterator[KafkaAdminClient]:
    """An admin client for the command; an unreachable broker is a clear CLI error."""
    from ragwarm.kafka.admin import admin_client

    try:
        with admin_client(settings.servers, settings.client_options(), timeout_s=10.0) as admin:
            yield admin
    except (KafkaTimeoutError, KafkaConnectionError) as exc:
        raise click.ClickException(unreachable_message(settings.servers, exc)) from None
    except KafkaError as exc:
        raise click.ClickException(f"{settings.servers}: {exc}") from None


def plan_range(
    admin: KafkaAdminClient,
    topic: str,
    start: Position,
    end: Position,
    committed: Mapping[int, int] | None = None,
) -> list[PartitionPlan]:
    """The per-partition plan of [start, end) of `topic` as the broker holds it now."""
    bounds = read_bounds(admin, topic)
    if bounds is None:
        raise click.ClickException(f"topic {topic!r} does not exist")
    times = [p.value for p in (start, end) if p.kind == "time" and p.value is not None]
    parts = [b.partition for b in bounds]
    at_times = offsets_at_times(admin, topic, parts, times) if times else {}
    return plan_partitions(bounds, start, end, at_times, committed)


def run_reset(
    settings: KafkaSettings, topic: str, group: str, start: Position, dry_run: bool, as_json: bool
) -> None:
    with admin_session(settings) as admin:
        description = _retrying(lambda: admin.describe_groups([group]))[group]
        refusal = group_refusal(group, description)
        if refusal:
            raise click.ClickException(refusal)
        committed = committed_offsets(admin, group, topic)
        try:
            plans = plan_range(admin, topic, start, Position("end"), committed)
        except ValueError as exc:  # a shift on a partition the group never committed
            raise click.ClickException(str(exc)) from None
        if not dry_run:
            reset_group(admin, group, topic, plans)
    verb = "would reset" if dry_run else "reset"
    summary = f"{verb} group {group!r} on {topic} to {start}"
    _report(plans, summary, {"mode": "group", "group": group}, topic, dry_run, as_json)


def run_copy(
    settings: KafkaSettings,
    topic: str,
    into: str,
    start: Position,
    end: Position,
    dry_run: bool,
    as_json: bool,
) -> None:
    with admin_session(settings) as admin:
        plans = plan_range(admin, topic, start, end)
        target = read_bounds(admin, into)
    notes = _target_notes(into, target, len(plans), dry_run)
    copied: Counter[int] = Counter()
    if not dry_run:
        if target is None:
            _create_topic(settings, into, len(plans))
        # Same partition count: keep each record's partition, so per-key placement and order
        # stay exactly as in the source.
        keep = target is None or len(target) == len(plans)
        copied = _copy(settings, topic, into, plans, keep)
    count = sum(p.count for p in plans) if dry_run else sum(copied.values())
    verb = "would copy" if dry_run else "copied"
    summary = f"{verb} {count} records of {topic} [{start}, {end}) into {into}"
    extra = {"mode": "copy", "into": into, "notes": notes, "copied": sum(copied.values())}
    _report(plans, summary, extra, topic, dry_run, as_json)


def _target_notes(
    into: str, target: list[Bounds] | None, partitions: int, dry_run: bool
) -> list[str]:
    if target is None:
        verb = "would be" if dry_run else "was"
        return [
            f"{into} does not exist; it {verb} created with {partitions} partitions"
            " and no time retention"
        ]
    if len(target) != partitions:
        return [f"{into} has {len(target)} partitions, not {partitions}: records are placed by key"]
    return []


def _create_topic(settings: KafkaSettings, name: str, partitions: int) -> None:
    from ragwarm.kafka.admin import create_topics
    from schemas.topics import TopicSpec

    create_topics(
        settings.servers,
        settings.client_options(),
        # Copies keep their source timestamps. Under the broker's default time retention
        # (7 days) a copy of older records, such as an edit history, would be deleted at
        # the broker's next retention check, minutes after the copy.
        [TopicSpec(name, "copy", partitions, {"retention.ms": "-1"})],
        replicas=settings.topic_replicas,
    )


def _copy(
    settings: KafkaSettings, topic: str, into: str, plans: Sequence[PartitionPlan], keep: bool
) -> Counter[int]:
    consumer = KafkaConsumer(
        bootstrap_servers=settings.servers.split(","),
        enable_auto_commit=False,
        **settings.client_options(),
    )
    producer = KafkaProducer(
        bootstrap_servers=settings.servers.split(","),
        linger_ms=20,
        **settings.producer_options(),
    )
    try:
        return copy_range(consumer, producer, topic, into, plans, keep)
    except KafkaError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        consumer.close()
        producer.close()


def _report(
    plans: Sequence[PartitionPlan],
    summary: str,
    extra: dict[str, Any],
    topic: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    if as_json:
        rows = [asdict(p) | {"records": p.count} for p in plans]
        out = {"topic": topic, "dry_run": dry_run, "partitions": rows} | extra
        out["records"] = sum(p.count for p in plans)
        click.echo(json.dumps(out))
        return
    for line in plan_table(plans, with_committed=extra["mode"] == "group"):
        click.echo(line)
    for note in extra.get("notes", []):
        click.echo(f"note: {note}")
    click.echo(summary + (DRY_RUN_NOTE if dry_run else ""))
