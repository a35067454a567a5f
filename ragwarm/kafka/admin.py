"""Topic administration with kafka-python: idempotent creation from `schemas.topics`, listing."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError, TopicAlreadyExistsError

from schemas.topics import TOPICS, TopicSpec

if TYPE_CHECKING:
    from ragwarm.settings import KafkaSettings

CLIENT_ID = "ragwarm-admin"


@contextmanager
def admin_client(
    bootstrap: str, client_options: Mapping[str, object], timeout_s: float = 30.0
) -> Iterator[KafkaAdminClient]:
    """A connected admin client that is closed on exit."""
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap.split(","),
        client_id=CLIENT_ID,
        bootstrap_timeout_ms=int(timeout_s * 1000),
        request_timeout_ms=int(timeout_s * 1000),
        **client_options,
    )
    try:
        yield admin
    finally:
        admin.close()


def probe(
    bootstrap: str, client_options: Mapping[str, object], timeout_s: float
) -> dict[str, object] | None:
    """Cluster metadata (brokers, controller, cluster id) if the cluster answers, else None."""
    try:
        with admin_client(bootstrap, client_options, timeout_s) as admin:
            return dict(admin.describe_cluster())
    except (KafkaError, OSError):
        return None


def _request(spec: TopicSpec, replicas: int) -> dict[str, object]:
    # -1 replicas: the cluster's default.replication.factor (1 locally, 3 on most clusters).
    return {
        "num_partitions": spec.partitions,
        "replication_factor": replicas,
        "configs": spec.config,
    }


def create_topics(
    bootstrap: str,
    client_options: Mapping[str, object],
    specs: Iterable[TopicSpec] = TOPICS.values(),
    timeout_s: float = 30.0,
    replicas: int = -1,
) -> tuple[list[str], list[str]]:
    """Create the topics that are missing; return (created, already existing) names."""
    specs = list(specs)
    with admin_client(bootstrap, client_options, timeout_s) as admin:
        present = set(admin.list_topics())
        missing = {s.name: _request(s, replicas) for s in specs if s.name not in present}
        created: list[str] = []
        if missing:
            result = admin.create_topics(
                missing, timeout_ms=int(timeout_s * 1000), raise_errors=False
            )
            created = _check_created(result)
            admin.wait_for_topics(created, timeout_ms=int(timeout_s * 1000))
        existing = [s.name for s in specs if s.name not in created]
        align_configs(admin, [s for s in specs if s.name in existing])
    return created, existing


def align_configs(admin: KafkaAdminClient, specs: Iterable[TopicSpec]) -> list[str]:
    """Set the spec's configs on existing topics whose values differ; returns their names.

    A topic made by an older release keeps its old settings otherwise (kb.changes became
    compacted: without this, an upgraded broker would keep deleting old document versions).
    """
    wanted = {s.name: s.config for s in specs if s.config}
    if not wanted:
        return []
    found = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in wanted]
    )["topic"]
    stale = [
        name
        for name, config in wanted.items()
        if any(found.get(name, {}).get(k, {}).get("value") != v for k, v in config.items())
    ]
    if stale:
        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n, configs=wanted[n]) for n in stale],
            incremental=True,
        )
    return stale


def _check_created(result: Mapping[str, object]) -> list[str]:
    """Names the broker created; a concurrent creator's topic counts as existing."""
    created, failures = [], []
    for topic in result["topics"]:  # type: ignore[attr-defined]
        code = topic["error_code"]
        if code == 0:
            created.append(topic["name"])
        elif code != TopicAlreadyExistsError.errno:
            failures.append(f"{topic['name']}: {topic.get('error_message') or f'error {code}'}")
    if failures:
        raise KafkaError("could not create topics: " + "; ".join(failures))
    return created


def wait_for_topics(
    bootstrap: str,
    client_options: Mapping[str, object],
    names: Iterable[str],
    timeout_s: float = 30.0,
) -> None:
    """Block until every topic exists with a leader on each partition."""
    with admin_client(bootstrap, client_options, timeout_s) as admin:
        admin.wait_for_topics(list(names), timeout_ms=int(timeout_s * 1000))


def list_topics(
    bootstrap: str, client_options: Mapping[str, object], timeout_s: float = 30.0
) -> dict[str, int]:
    """Every topic of the cluster with its partition count, internal topics excluded."""
    with admin_client(bootstrap, client_options, timeout_s) as admin:
        topics = admin.describe_topics()
    return {
        t["name"]: len(t["partitions"])
        for t in sorted(topics, key=lambda t: t["name"])
        if not t.get("is_internal")
    }


def delete_topics(
    bootstrap: str, client_options: Mapping[str, object], names: Iterable[str]
) -> None:
    """Delete topics (used by tests to clean up the ones they made)."""
    names = list(names)
    if names:
        with admin_client(bootstrap, client_options) as admin:
            admin.delete_topics(names)


def uncommitted(servers: str, options: Mapping[str, object], topic: str,
                groups: Iterable[str]) -> dict[str, dict[int, int]]:
    """Per consumer group, per partition of `topic`, the records it has not committed yet
    (partitions it has committed to their end are left out)."""
    from kafka import KafkaConsumer, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=servers, **options)
    consumer = KafkaConsumer(bootstrap_servers=servers, **options)
    try:
        parts = [TopicPartition(topic, n) for n in consumer.partitions_for_topic(topic) or ()]
        ends = consumer.end_offsets(parts)
        out = {}
        for group in groups:
            done = admin.list_group_offsets(group).get(group, {})
            lag = {tp.partition: ends[tp] - (done[tp].offset if tp in done else 0)
                   for tp in parts}
            out[group] = {n: left for n, left in lag.items() if left}
        return out
    finally:
        consumer.close()
        admin.close()


def commands_behind(kafka: KafkaSettings, worker_ids: Iterable[str]) -> dict[str, int]:
    """Per worker id, the `warmup.commands` records its consumer group has not committed.
    A worker commits a command's offset only after applying it, so 0 means every command
    sent so far has run there."""
    from schemas.topics import WARMUP_COMMANDS
    from workers.commands import command_group_id

    groups = {command_group_id(w, kafka.topic_prefix): w for w in worker_ids}
    lag = uncommitted(kafka.servers, kafka.client_options(), kafka.topic(WARMUP_COMMANDS),
                      groups)
    return {groups[g]: sum(left.values()) for g, left in lag.items()}
