"""`ragwarm up`, `status` and `down` against the real broker: every part healthy, then gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ragwarm.ports import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], env: dict[str, str], timeout: float = 400) -> subprocess.CompletedProcess:
    # `python -m` from the checkout: the code under test, as the stack's own processes run.
    return subprocess.run(
        [sys.executable, "-m", "ragwarm.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def stack_env(kafka_bootstrap: str, namespace: str, home: Path) -> dict[str, str]:
    return {
        "RAGWARM_HOME": str(home),
        "RAGWARM_MODEL_LLM_PATH": str(_llm_dir()),
        "RAGWARM_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RAGWARM_KAFKA_TOPIC_PREFIX": namespace,
        "RAGWARM_STREAMS_APP_ID": namespace + "stack",
        "RAGWARM_STREAMS_WEB_PORT": str(free_port()),
        "RAGWARM_STACK_WORKER_PORT": str(free_port()),
        "RAGWARM_GATEWAY_PORT": str(free_port()),
        "RAGWARM_WORKER_THREADS": "1",
    }


def retrieve(env: dict[str, str], key: str | None) -> httpx.Response:
    url = f"http://127.0.0.1:{env['RAGWARM_STREAMS_WEB_PORT']}/ragwarm/retrieve"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"question": "who rotates the vault password?", "tenant": "default"}
    return httpx.post(url, json=body, headers=headers, timeout=120)


def models(env: dict[str, str], key: str | None) -> int:
    url = f"http://127.0.0.1:{env['RAGWARM_GATEWAY_PORT']}/v1/models"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(url, headers=headers, timeout=30).status_code


def test_up_status_down(kafka_bootstrap, namespace, tmp_path):
    """A fresh `up` with no security settings: keys made once (0600), the views and the
    gateway refuse a request without one and answer the printed key; status sends it."""
    env = stack_env(kafka_bootstrap, namespace, tmp_path / "home")
    keys = tmp_path / "home" / "keys"
    pids: list[int] = []
    try:
        up = run(["up"], env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "streams: healthy" in up.stdout and "worker-1: healthy" in up.stdout
        key = (keys / "operator.key").read_text().strip()
        assert f"new operator key {key}" in up.stdout and str(keys / "operator.key") in up.stdout
        for name in ("operator.key", "signing.key"):
            assert (keys / name).stat().st_mode & 0o777 == 0o600
        assert retrieve(env, None).status_code == 401
        assert retrieve(env, "not-the-key").status_code == 401
        answered = retrieve(env, key)
        assert answered.status_code == 200, answered.text
        assert models(env, None) == 401 and models(env, key) == 200

        again = run(["up"], env)
        assert "already running" in again.stdout
        assert key not in again.stdout  # printed once, at creation
        assert (keys / "operator.key").read_text().strip() == key  # reused

        status = run(["status", "--json"], env)
        report = json.loads(status.stdout)
        assert report["streams"]["healthy"] and report["worker-1"]["ready"]
        # Both views need the operator key: status sent the stored one.
        assert report["worker-1"]["cache"] is not None
        assert report["streams"]["stats"] is not None
        pids = [report["streams"]["pid"], report["worker-1"]["pid"]]
    finally:
        down = run(["down"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert json.loads(run(["status", "--json"], env).stdout)["streams"]["pid"] is None


def test_up_with_the_documented_streams_api_key(kafka_bootstrap, namespace, tmp_path):
    """`RAGWARM_STREAMS_API_KEY=k ragwarm up` starts: the stack's readiness checks (the
    gateway's client reads /ragwarm/workers) and status use k, as every process does."""
    env = {**stack_env(kafka_bootstrap, namespace + "k.", tmp_path / "home"),
           "RAGWARM_STREAMS_API_KEY": "k"}
    try:
        up = run(["up"], env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "gateway: healthy" in up.stdout
        assert "operator key from your RAGWARM_*_API_KEY setting" in up.stdout
        assert retrieve(env, None).status_code == 401
        assert retrieve(env, "k").status_code == 200
        assert models(env, "k") == 200
        report = json.loads(run(["status", "--json"], env).stdout)
        assert report["streams"]["stats"] is not None and report["worker-1"]["cache"] is not None
    finally:
        down = run(["down"], env)
    assert down.returncode == 0, down.stdout + down.stderr


def test_up_refuses_ports_it_cannot_have(kafka_bootstrap, namespace, tmp_path):
    """Two services given one port: `up` says which and how to fix it, and starts nothing
    (before, the streams app lost its port to the worker and exited mid-start)."""
    env = stack_env(kafka_bootstrap, namespace + "p.", tmp_path / "home")
    env["RAGWARM_STACK_WORKER_PORT"] = env["RAGWARM_STREAMS_WEB_PORT"]
    up = run(["up"], env)
    assert up.returncode == 1
    port = env["RAGWARM_STREAMS_WEB_PORT"]
    assert f"streams and worker-1 are both given port {port}" in up.stderr
    assert "RAGWARM_STACK_WORKER_PORT" in up.stderr and "Traceback" not in up.stderr
    assert not list((tmp_path / "home").glob("run/*.pid"))


def _llm_dir() -> Path:
    from ragwarm.models import llm_dir

    return llm_dir()
