"""Unknown RAGWARM_ variables are refused with the nearest valid name; settings forbid extras."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragwarm.cli import main
from ragwarm.cli.env import (
    environment_problems,
    settings_classes,
    unknown_variables,
    variable_names,
)


def test_a_misspelt_setting_gets_the_nearest_valid_name():
    (problem,) = environment_problems({"RAGWARM_STREAMS_PREFIX_TTL_SECONDS": "5", "HOME": "/root"})
    assert problem.suggestion == "RAGWARM_STREAMS_PREFIX_TTL_S"
    assert "did you mean RAGWARM_STREAMS_PREFIX_TTL_S?" in str(problem)


@pytest.mark.parametrize(("name", "nearest"), [
    ("RAGWARM_RAG_TOPK", "RAGWARM_RAG_TOP_K"),
    ("RAGWARM_WORKER_KV_BYTE", "RAGWARM_WORKER_KV_BYTES"),
    ("RAGWARM_CLIENT_STREAM_URL", "RAGWARM_CLIENT_STREAMS_URL"),
])
def test_typical_typos(name, nearest):
    assert [p.suggestion for p in environment_problems({name: "1"})] == [nearest]


def test_valid_names_and_other_variables_pass():
    environ = {"RAGWARM_HOME": "/x", "RAGWARM_RAG_TOP_K": "3", "PATH": "/bin", "RAGWARMX": "1"}
    assert environment_problems(environ) == []


def test_a_name_like_nothing_gets_no_suggestion():
    (problem,) = environment_problems({"RAGWARM_FOO": "1"})
    assert problem.suggestion is None and str(problem) == "RAGWARM_FOO"


class Inner(BaseModel):
    ttl_s: float = 1.0


class Nested(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAGWARM_N_", env_nested_delimiter="__")
    streams: Inner = Inner()


def test_a_nested_model_accepts_its_subfields():
    valid = variable_names(Nested)
    assert unknown_variables({"RAGWARM_N_STREAMS__TTL_S": "2"}, valid) == []
    assert [u.name for u in unknown_variables({"RAGWARM_N_STREAMZ": "2"}, valid)] == [
        "RAGWARM_N_STREAMZ"]


def test_every_component_settings_class_forbids_unknown_keys():
    for cls in settings_classes():
        assert cls.model_config.get("extra") == "forbid", cls.__name__
        with pytest.raises(ValidationError, match="no_such_setting"):
            cls(no_such_setting=1)


def test_config_check_says_ok_or_lists_the_unknown(monkeypatch):
    runner = CliRunner()
    for name in [n for n in os.environ if n.startswith("RAGWARM_")]:
        monkeypatch.delenv(name)
    ok = runner.invoke(main, ["config", "--check"])
    assert (ok.exit_code, ok.output.strip()) == (0, "ok")
    monkeypatch.setenv("RAGWARM_STREAMS_PREFIX_TTL_SECONDS", "5")
    bad = runner.invoke(main, ["config", "--check"])
    assert bad.exit_code == 1 and "RAGWARM_STREAMS_PREFIX_TTL_S" in bad.output


def test_every_other_command_fails_fast_on_an_unknown_variable(monkeypatch):
    monkeypatch.setenv("RAGWARM_STREAMS_PREFIX_TTL_SECONDS", "5")
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1 and "did you mean RAGWARM_STREAMS_PREFIX_TTL_S?" in result.output
