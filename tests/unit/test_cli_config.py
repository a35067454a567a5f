"""`ragwarm --version`, and `ragwarm config`: the values in effect, their source, secrets masked."""

from __future__ import annotations

import json
from importlib.metadata import version

from click.testing import CliRunner
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragwarm.cli import main
from ragwarm.cli.tree import ConfigTree, effective
from ragwarm.settings import KafkaSettings


def _config(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["config", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_version_is_the_installed_distributions():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"ragwarm {version('ragwarm')}"


def test_a_value_set_in_the_environment_is_in_effect_with_source_env():
    code, out, _ = _config({"RAGWARM_KAFKA_BOOTSTRAP": "broker-7:9092"}, "--json")
    assert code == 0
    shown = json.loads(out)["KafkaSettings"]
    assert shown["RAGWARM_KAFKA_BOOTSTRAP"] == {
        "value": "broker-7:9092", "source": "env", "default": None}
    assert shown["RAGWARM_KAFKA_PORT"] == {"value": 39092, "source": "default", "default": 39092}


def test_a_setting_read_under_another_name_names_the_variable_that_set_it():
    code, out, _ = _config({"RAGWARM_GATEWAY_PORT": "9001"}, "--json")
    assert code == 0
    stack = json.loads(out)["StackSettings"]
    assert stack["RAGWARM_GATEWAY_PORT"] == {"value": 9001, "source": "env", "default": 8088}


def test_secrets_are_masked_in_both_forms():
    env = {"RAGWARM_KAFKA_SASL_PASSWORD": "hunter2-pw", "RAGWARM_CLIENT_API_KEY": "k-9f3e7a"}
    for args in ((), ("--json",)):
        code, out, err = _config(env, *args)
        assert code == 0
        assert "hunter2-pw" not in out + err and "k-9f3e7a" not in out + err
    shown = json.loads(_config(env, "--json")[1])
    assert shown["KafkaSettings"]["RAGWARM_KAFKA_SASL_PASSWORD"]["value"] == "**********"
    assert shown["KafkaSettings"]["RAGWARM_KAFKA_SASL_PASSWORD"]["source"] == "env"


def test_the_text_form_shows_value_and_source():
    code, out, _ = _config({"RAGWARM_RAG_TOP_K": "5"})
    assert code == 0
    assert ["RAGWARM_RAG_TOP_K", "5", "(env)"] in [line.split() for line in out.splitlines()]
    assert ["RAGWARM_RAG_CHUNK_TOKENS", "256", "(default)"] in [
        line.split() for line in out.splitlines()]


def test_a_value_that_does_not_validate_is_reported_without_echoing_it():
    code, out, _ = _config({"RAGWARM_WORKER_PORT": "not-a-port-xyz"}, "--json")
    assert code == 1
    shown = json.loads(out)
    assert "port" in shown["errors"]["WorkerSettings"]
    assert "not-a-port-xyz" not in out
    assert "KafkaSettings" in shown  # the other components still print


def test_an_unknown_variable_is_listed_with_its_nearest_name():
    code, out, _ = _config({"RAGWARM_RAG_TOPK": "5"}, "--json")
    assert code == 0
    assert json.loads(out)["unknown"] == ["RAGWARM_RAG_TOPK (did you mean RAGWARM_RAG_TOP_K?)"]


class _Demo(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_", extra="forbid")

    size: int = Field(default=3)
    token: SecretStr | None = None


def test_effective_reads_sources_case_insensitively_from_the_given_environment():
    rows = effective(_Demo(size=4, token=SecretStr("t")), {"demo_size": "4", "OTHER": "x"})
    assert [(r.variable, r.value, r.source, r.default) for r in rows] == [
        ("DEMO_SIZE", 4, "env", 3),
        ("DEMO_TOKEN", "**********", "default", None),
    ]


def test_the_tree_reads_each_component_once(monkeypatch):
    monkeypatch.setenv("RAGWARM_KAFKA_PORT", "40000")
    tree = ConfigTree()
    first = tree.kafka
    monkeypatch.setenv("RAGWARM_KAFKA_PORT", "40001")
    assert tree.kafka is first and tree.get(KafkaSettings).port == 40000
