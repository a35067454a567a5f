"""Topic specs are well formed, and the local broker's config suits a single node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragwarm.kafka.local import new_cluster_id, server_properties
from ragwarm.settings import KafkaSettings
from schemas import topics
from schemas.topics import TOPICS

# Kafka's legal topic names; '.' and '_' collide in metric names, so we use only '.'.
TOPIC_NAME = re.compile(r"^[a-z0-9.-]{1,249}$")
DESIGN_TOPICS = {"kb.changes", "rag.queries", "warmup.commands", "worker.events"}


def test_names_are_unique_and_match_their_keys() -> None:
    names = [spec.name for spec in TOPICS.values()]
    constants = [v for k, v in vars(topics).items() if k.isupper() and isinstance(v, str)]
    assert len(set(names)) == len(names)
    assert all(name == key for key, name in zip(TOPICS, names, strict=True))
    assert sorted(constants) == sorted(names)
    assert DESIGN_TOPICS | {"ragwarm.deadletter", "rag.chunks"} == set(names)


@pytest.mark.parametrize("spec", TOPICS.values(), ids=list(TOPICS))
def test_spec_is_valid(spec: topics.TopicSpec) -> None:
    assert TOPIC_NAME.match(spec.name)
    assert spec.partitions > 0
    assert spec.key
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec.config.items())
    assert int(spec.config.get("retention.ms", "-1")) >= -1


def _props(kafka: KafkaSettings) -> dict[str, str]:
    text = server_properties(kafka, Path("/data"))
    return dict(line.split("=", 1) for line in text.splitlines())


def test_single_node_config_needs_one_replica_everywhere() -> None:
    props = _props(KafkaSettings(port=1234, controller_port=1235))
    replication = {k: v for k, v in props.items() if "replication.factor" in k or "isr" in k}
    assert len(replication) >= 6
    assert set(replication.values()) == {"1"}
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:1235"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:1234,CONTROLLER://127.0.0.1:1235"
    assert props["log.dirs"] == "/data"


def test_cluster_ids_look_like_kafka_uuids() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{22}", i) and not i.startswith("-") for i in ids)
