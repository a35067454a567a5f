"""Table recovery that stops receiving records is sought back by the watchdog.

A real Faust app (`recovery_app.py`) on the real broker rebuilds a memory table from a
changelog of 40 records, but its first changelog seek is sent past them, as when a fetch's
records were dropped after the position moved on (the takeover stall of
lab/2026-12-07-takeover-stall.md). Faust alone would wait for those records for good.
With the watchdog's quiet period at 3 s, the table must come back whole, the seek be
counted, and the log name the partition with its position past the records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ragwarm.kafka.admin import create_topics, delete_topics
from ragwarm.ports import free_port
from schemas.topics import TopicSpec

pytestmark = pytest.mark.integration

RECORDS = 40
APP = Path(__file__).with_name("recovery_app.py")
ROOT = Path(__file__).resolve().parents[2]


def test_a_recovery_past_its_records_is_sought_back(
    kafka_bootstrap, kafka_settings, kafka_producer, unique_name, tmp_path
):
    app_id = unique_name("recovery")
    changelog = f"{app_id}-items-changelog"
    options = kafka_settings.client_options()
    create_topics(kafka_bootstrap, options,
                  [TopicSpec(changelog, "test", 1, {"cleanup.policy": "compact"})])
    try:
        for i in range(RECORDS):
            kafka_producer.send(changelog, key=json.dumps(f"k{i}").encode(),
                                value=json.dumps({"i": i}).encode())
        kafka_producer.flush()
        port = free_port()
        env = {**os.environ, "APP_ID": app_id, "BOOTSTRAP": kafka_bootstrap,
               "PORT": str(port), "DATA_DIR": str(tmp_path / "faust"), "STALL_S": "3",
               "SABOTAGE_SEEK": str(RECORDS), "PYTHONPATH": str(ROOT)}
        log_file = tmp_path / "app.log"
        with log_file.open("w") as log, subprocess.Popen(
            [sys.executable, str(APP)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        ) as proc:
            try:
                state = wait_recovered(f"http://127.0.0.1:{port}/state", proc, log_file)
            finally:
                proc.terminate()
                proc.wait(30)
        assert state["count"] == RECORDS
        assert state["recovery_reseeks"] >= 1 and state["recovery_stalls"] == 1
        line = next(x for x in log_file.read_text().splitlines() if "table recovery:" in x)
        # Sought back to its first record, from a position past the last.
        assert f"{changelog}[0] to 0 (highwater {RECORDS - 1}), position {RECORDS}" in line
    finally:
        delete_topics(kafka_bootstrap, options, [changelog])


def wait_recovered(url: str, proc: subprocess.Popen, log_file: Path,
                   timeout_s: float = 60.0) -> dict:
    """The app's state once its table holds every record and recovery ended."""
    deadline, state = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the app exited ({proc.returncode}):\n"
                                 + log_file.read_text()[-3000:])
        try:
            state = httpx.get(url, timeout=5.0).json()
        except httpx.HTTPError:
            state = {}
        if state.get("count") == RECORDS and not state.get("in_recovery"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"the table did not recover in {timeout_s:.0f} s (last state "
                         f"{state}):\n" + log_file.read_text()[-3000:])
