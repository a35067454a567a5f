"""`ragwarm replay` against the real broker: group resets, range copies, and the dry runs
that are the default (nothing changes without --execute)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.consumer.fetcher import ConsumerRecord

from ragwarm.cli.replay import replay
from ragwarm.kafka.admin import admin_client, delete_topics, list_topics
from ragwarm.settings import KafkaSettings
from tests.integration.kafka_read import partitions, read_topic

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
N = 20  # records i = 0..19, stamped T0 + i s, on partition i % 2


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _run(bootstrap: str, *args: str) -> Result:
    env = {"RAGWARM_KAFKA_BOOTSTRAP": bootstrap}
    return CliRunner().invoke(replay, list(args), env=env, catch_exceptions=False)


def _fill(producer: KafkaProducer, topic: str) -> None:
    for i in range(N):
        producer.send(
            topic,
            key=f"k{i}".encode(),
            value=f"v{i}".encode(),
            headers=[("origin", b"test"), ("i", str(i).encode())],
            partition=i % 2,
            timestamp_ms=_ms(T0 + timedelta(seconds=i)),
        )
    producer.flush(timeout=30)


@pytest.fixture
def source(kafka_producer: KafkaProducer, new_topic: Callable[..., str]) -> str:
    topic = new_topic("replay", partitions=2)
    _fill(kafka_producer, topic)
    return topic


def _options() -> dict[str, object]:
    return KafkaSettings().client_options()


def _drain(consumer: KafkaConsumer, expected: int) -> list[ConsumerRecord]:
    """Poll until `expected` records came (60 s at most), then once more to catch extras."""
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < deadline:
        got.extend(r for rs in consumer.poll(timeout_ms=500).values() for r in rs)
    got.extend(r for rs in consumer.poll(timeout_ms=1500).values() for r in rs)
    return got


def _consume_as_group(bootstrap: str, topic: str, group: str, expected: int) -> list[int]:
    """Read what the group has not yet read, commit, leave; return the record numbers."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **_options(),
    )
    try:
        records = _drain(consumer, expected)
        consumer.commit()
        return sorted(int(r.value.decode()[1:]) for r in records)
    finally:
        consumer.close()


def _read_range(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    return read_topic(bootstrap, topic)


def _committed(bootstrap: str, group: str) -> dict[int, int]:
    with admin_client(bootstrap, _options()) as admin:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    return {tp.partition: om.offset for tp, om in offsets.items()}


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **_options())
    try:
        parts = partitions(consumer, topic)
        return {tp.partition: o for tp, o in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


@pytest.fixture
def absent_topic(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> Iterator[str]:
    """A topic name no one has created; deleted afterwards if a test made it."""
    name = unique_name("replay-into")
    yield name
    if name in list_topics(kafka_bootstrap, _options()):
        delete_topics(kafka_bootstrap, _options(), [name])


# --- group resets ----------------------------------------------------------------------------
def test_group_reset_to_a_time_rereads_exactly_the_records_from_then_on(
    kafka_bootstrap: str, source: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("group")
    assert _consume_as_group(kafka_bootstrap, source, group, N) == list(range(N))
    assert _consume_as_group(kafka_bootstrap, source, group, 0) == []

    cut = (T0 + timedelta(seconds=13)).isoformat()
    result = _run(kafka_bootstrap, source, "--from", cut, "--group", group, "--execute")

    assert result.exit_code == 0, result.output
    assert f"reset group '{group}'" in result.output and "dry run" not in result.output
    assert _consume_as_group(kafka_bootstrap, source, group, N - 13) == list(range(13, N))


def test_group_reset_to_an_offset_and_to_beginning(
    kafka_bootstrap: str, source: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("group")
    _consume_as_group(kafka_bootstrap, source, group, N)

    reset = _run(kafka_bootstrap, source, "--from", "7", "--group", group, "--execute")
    assert reset.exit_code == 0, reset.output
    # Offset 7 on both partitions: records 14, 16, 18 (even) and 15, 17, 19 (odd).
    assert _consume_as_group(kafka_bootstrap, source, group, 6) == list(range(14, N))

    reset = _run(kafka_bootstrap, source, "--from", "beginning", "--group", group, "--execute")
    assert reset.exit_code == 0, reset.output
    assert _consume_as_group(kafka_bootstrap, source, group, N) == list(range(N))


def test_a_time_after_the_last_record_maps_to_the_end(
    kafka_bootstrap: str, source: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("group")
    later = (T0 + timedelta(days=1)).isoformat()
    result = _run(kafka_bootstrap, source, "--from", later, "--group", group, "--json", "--execute")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert [(p["start"], p["end"], p["records"]) for p in plan["partitions"]] == [
        (10, 10, 0),
        (10, 10, 0),
    ]
    assert _consume_as_group(kafka_bootstrap, source, group, 0) == []


def test_a_group_with_active_members_is_refused(
    kafka_bootstrap: str, source: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("group")
    member = KafkaConsumer(
        source,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **_options(),
    )
    try:
        _drain(member, N)
        member.commit()
        before = _committed(kafka_bootstrap, group)

        result = _run(kafka_bootstrap, source, "--from", "beginning", "--group", group, "--execute")

        assert result.exit_code == 1
        assert "active member" in result.output and "stop its consumers" in result.output
        assert _committed(kafka_bootstrap, group) == before == {0: 10, 1: 10}
    finally:
        member.close()


def test_without_execute_a_group_reset_prints_the_plan_and_changes_nothing(
    kafka_bootstrap: str, source: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("group")
    _consume_as_group(kafka_bootstrap, source, group, N)
    cut = (T0 + timedelta(seconds=13)).isoformat()

    for explicit in ((), ("--dry-run",)):
        result = _run(kafka_bootstrap, source, "--from", cut, "--group", group, *explicit)

        assert result.exit_code == 0, result.output
        rows = [line.split() for line in result.output.splitlines()]
        assert ["0", "7", "10", "3", "10"] in rows  # partition, from, to, records, committed
        assert ["1", "6", "10", "4", "10"] in rows
        assert "dry run: nothing changed; run again with --execute" in result.output
    beginning = _run(kafka_bootstrap, source, "--from", "beginning", "--group", group, "--json")
    assert json.loads(beginning.output)["dry_run"] is True
    assert _committed(kafka_bootstrap, group) == {0: 10, 1: 10}
    assert _consume_as_group(kafka_bootstrap, source, group, 0) == []


def test_shift_by_moves_the_committed_offsets(
    kafka_bootstrap: str, source: str, unique_name: Callable[[str], str]
) -> None:
    group = unique_name("group")
    _consume_as_group(kafka_bootstrap, source, group, N)

    result = _run(kafka_bootstrap, source, "--shift-by", "-3", "--group", group, "--execute")

    assert result.exit_code == 0, result.output
    assert "committed offset -3" in result.output
    # Offsets 7-9 on both partitions: records 14, 16, 18 (even) and 15, 17, 19 (odd).
    assert _consume_as_group(kafka_bootstrap, source, group, 6) == list(range(14, N))


def test_shift_by_refuses_a_group_without_committed_offsets(
    kafka_bootstrap: str, source: str, unique_name: Callable[[str], str]
) -> None:
    result = _run(kafka_bootstrap, source, "--shift-by", "-3", "--group", unique_name("group"))
    assert result.exit_code == 1
    assert "partition(s) 0, 1 have none" in result.output


def test_by_duration_rereads_the_records_of_the_last_hour(
    kafka_bootstrap: str,
    kafka_producer: KafkaProducer,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic, group = new_topic("replay-recent", partitions=1), unique_name("group")
    now = datetime.now(UTC)
    for i, ago in enumerate((timedelta(hours=3), timedelta(hours=2), timedelta(minutes=30),
                             timedelta(minutes=10))):
        kafka_producer.send(topic, value=f"v{i}".encode(), partition=0,
                            timestamp_ms=_ms(now - ago))
    kafka_producer.flush(timeout=30)
    assert _consume_as_group(kafka_bootstrap, topic, group, 4) == [0, 1, 2, 3]

    result = _run(kafka_bootstrap, topic, "--by-duration", "PT1H", "--group", group, "--execute")

    assert result.exit_code == 0, result.output
    assert _consume_as_group(kafka_bootstrap, topic, group, 2) == [2, 3]


def test_to_is_refused_in_group_mode(kafka_bootstrap: str, source: str) -> None:
    result = CliRunner().invoke(
        replay,
        [source, "--from", "1", "--to", "3", "--group", "g"],
        env={"RAGWARM_KAFKA_BOOTSTRAP": kafka_bootstrap},
    )
    assert result.exit_code == 2
    assert "--to applies to --into" in result.output


# --- copies ----------------------------------------------------------------------------------
def _signature(record: ConsumerRecord) -> tuple:
    return (record.partition, record.key, record.value, record.timestamp, list(record.headers))


def test_copy_writes_the_same_records_into_the_target(
    kafka_bootstrap: str, source: str, new_topic: Callable[..., str]
) -> None:
    target = new_topic("replay-target", partitions=2)
    start, end = (T0 + timedelta(seconds=5)).isoformat(), (T0 + timedelta(seconds=15)).isoformat()

    result = _run(kafka_bootstrap, source, "--from", start, "--to", end, "--into", target,
                  "--execute")

    assert result.exit_code == 0, result.output
    assert "copied 10 records" in result.output
    wanted = [
        _signature(r)
        for r in _read_range(kafka_bootstrap, source)
        if _ms(T0 + timedelta(seconds=5)) <= r.timestamp < _ms(T0 + timedelta(seconds=15))
    ]
    copied = [_signature(r) for r in _read_range(kafka_bootstrap, target)]
    assert len(wanted) == 10
    assert sorted(copied) == sorted(wanted)
    assert [s for s in copied if s[0] == 0] == [s for s in wanted if s[0] == 0]  # order kept


def _topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    with admin_client(bootstrap, _options()) as admin:
        found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    return {k: v["value"] for k, v in found["topic"][topic].items()}


def test_copy_by_offsets_into_a_new_topic(
    kafka_bootstrap: str, source: str, absent_topic: str
) -> None:
    result = _run(kafka_bootstrap, source, "--from", "3", "--to", "6", "--into", absent_topic,
                  "--execute")

    assert result.exit_code == 0, result.output
    assert f"{absent_topic} does not exist; it was created with 2 partitions" in result.output
    assert _topic_config(kafka_bootstrap, absent_topic)["retention.ms"] == "-1"
    copied = _read_range(kafka_bootstrap, absent_topic)
    assert sorted(int(r.value.decode()[1:]) for r in copied) == [6, 7, 8, 9, 10, 11]


def test_copy_dry_run_changes_nothing(
    kafka_bootstrap: str, source: str, new_topic: Callable[..., str], absent_topic: str
) -> None:
    target = new_topic("replay-target", partitions=2)
    for into in (target, absent_topic):
        result = _run(kafka_bootstrap, source, "--from", "beginning", "--into", into)
        assert result.exit_code == 0, result.output
        rows = [line.split() for line in result.output.splitlines()]
        assert ["0", "0", "10", "10"] in rows and ["1", "0", "10", "10"] in rows
        assert "would copy 20 records" in result.output
    assert _end_offsets(kafka_bootstrap, target) == {0: 0, 1: 0}
    assert absent_topic not in list_topics(kafka_bootstrap, _options())


def test_unknown_source_topic_is_reported(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    missing = unique_name("missing")
    result = _run(kafka_bootstrap, missing, "--from", "beginning", "--into", unique_name("x"))
    assert result.exit_code == 1
    assert f"topic '{missing}' does not exist" in result.output
