"""A fresh venv with the base install (`pip install .`, not editable): the KbProducer example
of docs/production.md sends an event, there is no torch or Faust, and `ragwarm kafka start`
finds infra/ in the venv. Another with `[client]` alone runs the gateway's and the query's
commands.
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from ragwarm.ports import free_port
from schemas import KbChange, decode
from schemas.topics import KB_CHANGES
from tests.integration.kafka_read import subscriber

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SEND = """
import sys
from ragwarm.client.producer import KbProducer
from schemas import KbChange

with KbProducer(sys.argv[1], {}, topic=sys.argv[2]) as producer:
    producer.send(KbChange(op="upsert", doc_id="docs/slim.md", version=1, text="Slim install."))
    report = producer.flush(30)
assert not report.failed, report
print("sent")
"""


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with `pip install .` of a copy of the checkout (base only, from pip's cache)."""
    return _venv_with(tmp_path_factory.mktemp("slim"), str(ROOT))


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with `pip install '.[client]'` and nothing else."""
    return _venv_with(tmp_path_factory.mktemp("client"), f"{ROOT}[client]")


def _venv_with(where: Path, target: str) -> Path:
    venv.create(where / "venv", with_pip=True)
    pip = [str(where / "venv" / "bin" / "python"), "-m", "pip"]
    run = subprocess.run([*pip, "install", "--quiet", "--disable-pip-version-check",
                          target], capture_output=True, text=True, timeout=900,
                         cwd=where, env=_env())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return where / "venv"


def _env(**extra: str) -> dict[str, str]:
    # PYTHONPATH would put this checkout before the venv's own install.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, **extra}


def _run(venv_dir: Path, *args: str, timeout: float = 120, **env: str):
    return subprocess.run([str(venv_dir / "bin" / args[0]), *args[1:]], capture_output=True,
                          text=True, timeout=timeout, cwd=venv_dir, env=_env(**env))


def test_the_base_install_sends_kb_changes_without_torch_or_faust(
    base_venv: Path, kafka_bootstrap: str, namespace: str
) -> None:
    listed = _run(base_venv, "python", "-m", "pip", "list", "--format=freeze").stdout.lower()
    for heavy in ("torch", "faust-streaming", "transformers", "qdrant-client", "matplotlib"):
        assert f"\n{heavy}==" not in "\n" + listed, heavy
    where = _run(base_venv, "python", "-c", "import ragwarm; print(ragwarm.__file__)").stdout
    assert str(base_venv) in where  # the venv's copy, not this checkout
    topic = namespace + KB_CHANGES
    sent = _run(base_venv, "python", "-c", SEND, kafka_bootstrap, topic)
    assert sent.returncode == 0 and "sent" in sent.stdout, sent.stderr[-3000:]
    consumer = subscriber(kafka_bootstrap, topic, consumer_timeout_ms=20_000)
    try:
        got = [decode(m.value, KbChange) for m in consumer]
    finally:
        consumer.close()
    assert [c.doc_id for c in got] == ["docs/slim.md"]
    # The stored blend calibration is package data: an installed worker finds its gate.
    stored = _run(base_venv, "python", "-c", "from workers.calibration import load_calibration; "
                  "print(load_calibration('smollm2-135m-instruct') is not None)")
    assert stored.stdout.strip() == "True", stored.stderr[-3000:]
    hint = _run(base_venv, "ragwarm", "worker")
    assert hint.returncode != 0 and "ragwarm[worker]" in hint.stderr


def test_the_installed_launcher_starts_a_broker_from_the_packaged_infra(
    base_venv: Path, tmp_path: Path
) -> None:
    from ragwarm.settings import HomeSettings

    # A broker of its own (other ports, other home), sharing the jars already fetched.
    env = {"RAGWARM_HOME": str(tmp_path / "home"), "RAGWARM_KAFKA_PORT": str(free_port()),
           "RAGWARM_KAFKA_CONTROLLER_PORT": str(free_port()),
           "RAGWARM_KAFKA_JARS_DIR": str(HomeSettings().kafka_dir)}
    infra = _run(base_venv, "python", "-c",
                 "from ragwarm.settings import infra_dir; print(infra_dir('kafka'))").stdout
    assert infra.strip().startswith(str(base_venv))
    assert (Path(infra.strip()) / "pom.xml").exists()
    started = _run(base_venv, "ragwarm", "kafka", "start", timeout=180, **env)
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    finally:
        stopped = _run(base_venv, "ragwarm", "kafka", "stop", timeout=60, **env)
    assert stopped.returncode == 0, stopped.stderr[-2000:]


def test_the_client_extra_alone_runs_the_gateway_and_query_commands(client_venv: Path) -> None:
    listed = _run(client_venv, "python", "-m", "pip", "list", "--format=freeze").stdout.lower()
    for heavy in ("torch", "faust-streaming", "qdrant-client", "sentence-transformers"):
        assert f"\n{heavy}==" not in "\n" + listed, heavy
    for command in ("gateway", "query"):
        run = _run(client_venv, "ragwarm", command, "--help")
        assert run.returncode == 0 and "Usage:" in run.stdout, (command, run.stderr[-2000:])
    worker = _run(client_venv, "ragwarm", "worker", "--help")
    assert worker.returncode != 0 and "ragwarm[worker]" in worker.stderr
    fetch = _run(client_venv, "ragwarm", "models", "fetch")
    assert fetch.returncode != 0 and "torch" in fetch.stderr
    assert "ragwarm[streams,worker]" in fetch.stderr
