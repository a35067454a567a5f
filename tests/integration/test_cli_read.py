"""The read commands, run as a user runs them: `--json` gives JSON alone on stdout and nothing
on stderr, and an unreachable broker is reported in seconds with how to fix it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas.topics import TOPICS

pytestmark = pytest.mark.integration

READ_COMMANDS = [
    ["status", "--json"],
    ["kafka", "status", "--json"],
    ["topics", "list", "--json"],
    ["config", "--json"],
    ["models", "status", "--json"],
]
UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1: every connection is refused


def _ragwarm(
    args: list[str], env: dict[str, str], timeout_s: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ragwarm.cli", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s,
        check=False,
    )  # fmt: skip


@pytest.mark.parametrize("args", READ_COMMANDS, ids=" ".join)
def test_json_commands_print_json_alone(args: list[str], kafka_bootstrap: str, tmp_path: Path):
    env = {"RAGWARM_KAFKA_BOOTSTRAP": kafka_bootstrap, "RAGWARM_HOME": str(tmp_path)}
    done = _ragwarm(args, env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert isinstance(json.loads(done.stdout), dict)


def test_status_json_stays_clean_when_the_broker_is_unreachable(tmp_path: Path):
    done = _ragwarm(["status", "--json"],
                    {"RAGWARM_KAFKA_BOOTSTRAP": UNREACHABLE, "RAGWARM_HOME": str(tmp_path)})
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["kafka"]["running"] is False


def test_topics_list_json_marks_ragwarms_topics(kafka_bootstrap: str, tmp_path: Path):
    done = _ragwarm(["topics", "list", "--json"], {"RAGWARM_KAFKA_BOOTSTRAP": kafka_bootstrap})
    found = json.loads(done.stdout)
    for name in TOPICS:
        assert found[name]["ragwarm"] is True and found[name]["partitions"] >= 1


@pytest.mark.parametrize("args", [["topics", "list"], ["topics", "list", "--json"],
                                  ["topics", "create"], ["up"]], ids=" ".join)
def test_an_unreachable_broker_is_reported_in_seconds_with_the_fix(args: list[str], tmp_path: Path):
    began = time.monotonic()
    done = _ragwarm(args, {"RAGWARM_KAFKA_BOOTSTRAP": UNREACHABLE, "RAGWARM_HOME": str(tmp_path)})
    took = time.monotonic() - began
    assert done.returncode == 1
    assert f"Kafka is not reachable at {UNREACHABLE}" in done.stderr
    assert "`ragwarm kafka start`" in done.stderr and "RAGWARM_KAFKA_BOOTSTRAP" in done.stderr
    assert "kafka.net" not in done.stderr  # one error, not the client's retry log
    # The client's own bootstrap gives up after 30 s; the commands give up after 5 s (the
    # rest is the interpreter starting on a shared machine).
    assert took < 25, f"{' '.join(args)} took {took:.0f} s to report an unreachable broker"
