"""`ragwarm up`, `status` and `down` against the real broker: every part healthy, then gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.streams_proc import free_port

pytestmark = pytest.mark.integration

RAGWARM = Path(sys.executable).with_name("ragwarm")


def run(args: list[str], env: dict[str, str], timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(RAGWARM), *args],
        env={**os.environ, **env},
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def test_up_status_down(kafka_bootstrap, namespace, tmp_path):
    env = {
        "RAGWARM_HOME": str(tmp_path / "home"),
        "RAGWARM_MODEL_LLM_PATH": str(_llm_dir()),
        "RAGWARM_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RAGWARM_KAFKA_TOPIC_PREFIX": namespace,
        "RAGWARM_STREAMS_APP_ID": namespace + "stack",
        "RAGWARM_STREAMS_WEB_PORT": str(free_port()),
        "RAGWARM_STACK_WORKER_PORT": str(free_port()),
        "RAGWARM_WORKER_THREADS": "1",
    }
    try:
        up = run(["up"], env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "streams: healthy" in up.stdout and "worker-1: healthy" in up.stdout
        again = run(["up"], env)
        assert "already running" in again.stdout

        status = run(["status", "--json"], env)
        report = json.loads(status.stdout)
        assert report["streams"]["healthy"] and report["worker-1"]["ready"]
        assert report["worker-1"]["cache"] is not None
        pids = [report["streams"]["pid"], report["worker-1"]["pid"]]
    finally:
        down = run(["down"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert json.loads(run(["status", "--json"], env).stdout)["streams"]["pid"] is None


def _llm_dir() -> Path:
    from ragwarm.models import llm_dir

    return llm_dir()
