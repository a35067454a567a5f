"""Topic creation against the real broker is idempotent and applies the specs' configs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner
from kafka.admin import ConfigResource, ConfigResourceType

from ragwarm.cli.kafka import topics
from ragwarm.kafka.admin import admin_client, create_topics, delete_topics, list_topics
from ragwarm.settings import KafkaSettings
from schemas.topics import TOPICS, TopicSpec

pytestmark = pytest.mark.integration


def test_create_twice_creates_once(
    kafka_bootstrap: str, kafka_settings: KafkaSettings, unique_name: Callable[[str], str]
) -> None:
    specs = [TopicSpec(unique_name("idem"), "k", n, {"retention.ms": "60000"}) for n in (1, 3)]
    names = [s.name for s in specs]
    opts = kafka_settings.client_options()
    try:
        assert create_topics(kafka_bootstrap, opts, specs) == (names, [])
        assert create_topics(kafka_bootstrap, opts, specs) == ([], names)
        found = list_topics(kafka_bootstrap, opts)
        assert {n: found[n] for n in names} == {names[0]: 1, names[1]: 3}
    finally:
        delete_topics(kafka_bootstrap, opts, names)


def test_cli_topics_create_reports_existing(kafka_bootstrap: str) -> None:
    runner = CliRunner()
    first = runner.invoke(topics, ["create"])
    second = runner.invoke(topics, ["create"])

    assert first.exit_code == 0, first.output
    assert second.exit_code == 0, second.output
    assert sorted(second.output.split()) == sorted(["existing"] * len(TOPICS) + list(TOPICS))
    listed = runner.invoke(topics, ["list"])
    assert all(name in listed.output for name in TOPICS)


def _configs(bootstrap: str, settings: KafkaSettings, name: str) -> dict[str, str]:
    resource = ConfigResource(ConfigResourceType.TOPIC, name)
    with admin_client(bootstrap, settings.client_options()) as admin:
        found = admin.describe_configs([resource])["topic"][name]
    return {k: v["value"] for k, v in found.items()}


def test_topic_configs_come_from_specs(kafka_bootstrap: str, kafka_settings: KafkaSettings) -> None:
    for name, spec in TOPICS.items():
        configs = _configs(kafka_bootstrap, kafka_settings, name)
        assert {k: configs.get(k) for k in spec.config} == spec.config, name


def test_an_existing_topic_gets_the_specs_configs(
    kafka_bootstrap: str, kafka_settings: KafkaSettings, unique_name: Callable[[str], str]
) -> None:
    # A topic an older release made with other settings (kb.changes became compacted).
    opts = kafka_settings.client_options()
    old = TopicSpec(unique_name("old"), "k", 1, {"retention.ms": "60000"})
    new = TopicSpec(old.name, "k", 1, {"cleanup.policy": "compact"})
    try:
        create_topics(kafka_bootstrap, opts, [old])
        assert create_topics(kafka_bootstrap, opts, [new]) == ([], [old.name])
        assert _configs(kafka_bootstrap, kafka_settings, old.name)["cleanup.policy"] == "compact"
    finally:
        delete_topics(kafka_bootstrap, opts, [old.name])
