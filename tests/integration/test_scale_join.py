"""A second streams instance joins while the first is indexing its first batch: every KB
change is still handled, and every kb.changes partition's committed offset reaches its end.

Before `streams.rebalance`, the partitions the first instance kept across that rebalance
(nothing committed for them yet) stayed where its fetcher had left them, past the records
Faust dropped at the revocation: those changes were never indexed and the partitions' lag
never cleared (`bench pipeline --streams 2`, three runs in five). Whether the join lands
inside the first batch depends on timing: this does what that benchmark does.
"""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from ragwarm.bench.pipeline import DATA, trace_changes
from schemas import encode
from schemas.topics import KB_CHANGES, kb_key
from tests.integration.streams_proc import STARTED, StreamsApp
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

CHANGES = 60
APP_ENV = {"RAGWARM_STREAMS_SESSION_TIMEOUT_S": "10"}


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


@pytest.mark.timeout(1200)
@pytest.mark.xfail(strict=False, reason="issue 14: the --streams 2 stall is not fully fixed; with "
                   "streams.rebalance this passed 3 of 3 runs, but `bench pipeline --streams 2` "
                   "still left kb.changes partitions behind in 2 of 2 runs")
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
    changes = trace_changes(DATA / "events.jsonl", CHANGES)
    for change in changes:
        kafka_producer.send(namespace + KB_CHANGES, key=kb_key(change.tenant, change.doc_id),
                            value=encode(change))
    kafka_producer.flush()
    group, topic = namespace + "join", namespace + KB_CHANGES
    wait_for(lambda: not any(lag(kafka_bootstrap, group, topic).values()), 600,
             "every kb.changes partition committed to its end")
    handled = sum(app.counters().get(k, 0) for app in apps for k in ("kb_events", "stale_events"))
    assert handled >= len(changes)  # at least once: a change handled again is fine
