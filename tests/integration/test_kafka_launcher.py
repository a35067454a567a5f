"""`ragwarm kafka start|stop` on a throwaway home and ports: idempotent, one broker, clean stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragwarm.kafka.local import LocalKafka, LocalKafkaSettings
from ragwarm.ports import free_port
from ragwarm.settings import HomeSettings, KafkaSettings

pytestmark = pytest.mark.integration

RAGWARM = Path(sys.executable).parent / "ragwarm"


def _brokers_under(home: Path) -> list[int]:
    """Pids of kafka.Kafka JVMs whose command line points into `home`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"kafka.Kafka" in cmdline and str(home).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment of a second, private broker that shares the already fetched jars."""
    shared = LocalKafka(HomeSettings(), KafkaSettings(bootstrap=None))
    shared.ensure_jars()
    env = {k: v for k, v in os.environ.items() if k != "RAGWARM_KAFKA_BOOTSTRAP"}
    env.update(
        RAGWARM_HOME=str(tmp_path / "home"),
        RAGWARM_KAFKA_PORT=str(free_port()),
        RAGWARM_KAFKA_CONTROLLER_PORT=str(free_port()),
        RAGWARM_KAFKA_JARS_DIR=str(shared.jars_dir.parent),
    )
    return env


def _ragwarm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RAGWARM), *args], env=env, capture_output=True, text=True, timeout=180
    )


def test_start_twice_keeps_one_broker_and_stop_twice_succeeds(cli_env: dict[str, str]) -> None:
    home = Path(cli_env["RAGWARM_HOME"])
    try:
        first = _ragwarm(cli_env, "kafka", "start")
        assert first.returncode == 0, first.stdout + first.stderr
        pid = int((home / "run" / "kafka.pid").read_text())
        second = _ragwarm(cli_env, "kafka", "start")
        assert second.returncode == 0, second.stdout + second.stderr
        assert f"already running at 127.0.0.1:{cli_env['RAGWARM_KAFKA_PORT']}" in second.stdout
        assert _brokers_under(home) == [pid]
        status = json.loads(_ragwarm(cli_env, "kafka", "status", "--json").stdout)
        assert status["running"] and status["pid"] == pid
        assert status["version"] == KafkaSettings().version
    finally:
        stopped = _ragwarm(cli_env, "kafka", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert _brokers_under(home) == []
    again = _ragwarm(cli_env, "kafka", "stop")
    assert again.returncode == 0 and "not running" in again.stdout


def test_stop_with_nothing_running_exits_zero(cli_env: dict[str, str]) -> None:
    result = _ragwarm(cli_env, "kafka", "stop")

    assert result.returncode == 0, result.stderr
    assert "not running" in result.stdout
    status = json.loads(_ragwarm(cli_env, "kafka", "status", "--json").stdout)
    assert status["running"] is False and status["pid"] is None


def test_stop_waits_for_a_session_still_using_the_broker(cli_env: dict[str, str]) -> None:
    home = HomeSettings(home=Path(cli_env["RAGWARM_HOME"]))
    kafka = KafkaSettings(
        bootstrap=None,
        port=int(cli_env["RAGWARM_KAFKA_PORT"]),
        controller_port=int(cli_env["RAGWARM_KAFKA_CONTROLLER_PORT"]),
    )
    local = LocalKafkaSettings(jars_dir=Path(cli_env["RAGWARM_KAFKA_JARS_DIR"]))
    with LocalKafka(home, kafka, local, say=print):
        pid = int(home.run_dir.joinpath("kafka.pid").read_text())
        polite = _ragwarm(cli_env, "kafka", "stop")
        assert polite.returncode == 0 and "in use by" in polite.stdout
        assert _brokers_under(home.home) == [pid]
    assert _brokers_under(home.home) == []
