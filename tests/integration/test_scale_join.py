"""A second streams instance joins while the first is indexing its first batch: every KB
change is still handled, and every kb.changes partition's committed offset reaches its end.

Two defects left partitions behind for good (`streams.shell.rebalance`): the partitions the
first instance kept across that rebalance with nothing committed stayed where its fetcher
had left them, past the records Faust dropped at the revocation; and records fetched while
Faust resumed the stream partitions after the rebalance (between its seek and its
`flow_control.resume()`, which empties the streams' queues) were dropped with the fetch
position already past them (`bench pipeline --streams 2` stalled with either). Whether
the join lands inside the first batch depends on timing: this does what that benchmark
does. A stall fails the test once no committed offset moved for 2 minutes.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from ragwarm.settings import TRACE_DIR
from ragwarm.trace import trace_changes
from schemas import encode
from schemas.topics import KB_CHANGES, kb_key
from tests.integration.streams_proc import STARTED, StreamsApp

pytestmark = pytest.mark.integration

CHANGES = 60
APP_ENV = {"RAGWARM_STREAMS_SESSION_TIMEOUT_S": "10"}
STALL_S = 120.0  # no committed offset moved for this long: a partition is stuck


def lag(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Per partition of `topic`, the records the group has not committed."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        committed = admin.list_group_offsets(group).get(group, {})
        parts = [TopicPartition(topic, n) for n in consumer.partitions_for_topic(topic) or ()]
        ends = consumer.end_offsets(parts)
        return {tp.partition: ends[tp] - (committed[tp].offset if tp in committed else 0)
                for tp in parts}
    finally:
        consumer.close()
        admin.close()


def wait_committed(bootstrap: str, group: str, topic: str, stall_s: float = STALL_S) -> None:
    """Until every partition of `topic` is committed to its end; fails once no partition's
    committed offset has moved for `stall_s`, naming the partitions behind (a stuck
    partition never catches up, so waiting longer only hides it)."""
    last: dict[int, int] = {}
    moved = time.monotonic()
    while left := {n: behind for n, behind in lag(bootstrap, group, topic).items() if behind}:
        if left != last:
            last, moved = left, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise AssertionError(f"{topic}: no committed offset moved for {stall_s:.0f} s; "
                                 f"partitions behind (partition: records left): {left}")
        time.sleep(1.0)


@pytest.mark.timeout(900)
def test_an_instance_joining_mid_batch_leaves_no_partition_behind(
    kafka_bootstrap, kafka_producer, namespace, tmp_path
):
    apps = [StreamsApp(kafka_bootstrap, namespace, "join", tmp_path / f"i{i}", APP_ENV)
            for i in (1, 2)]
    # As `bench pipeline --streams 2` does: both start, and the changes go out once they
    # answer their health checks, which one of them does before it has joined the group.
    for app in apps:
        app.proc.start()
        STARTED.append(app)
    for app in apps:
        app.proc.wait_healthy(240)
    changes = trace_changes(TRACE_DIR / "events.jsonl", CHANGES)
    for change in changes:
        kafka_producer.send(namespace + KB_CHANGES, key=kb_key(change.tenant, change.doc_id),
                            value=encode(change))
    kafka_producer.flush()
    group, topic = namespace + "join", namespace + KB_CHANGES
    wait_committed(kafka_bootstrap, group, topic)
    handled = sum(app.counters().get(k, 0) for app in apps for k in ("kb_events", "stale_events"))
    assert handled >= len(changes)  # at least once: a change handled again is fine
