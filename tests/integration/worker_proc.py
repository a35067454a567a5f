"""Starts `ragwarm worker` as a separate process on a free port, for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ragwarm.ports import free_port

RAGWARM = Path(sys.executable).with_name("ragwarm")

# Every worker process started by tests, so a topic namespace can stop its users before
# its topics go (a consumer whose topic vanished polls metadata in a tight loop).
STARTED: list[WorkerProc] = []


@dataclass
class Probe:
    """One poll of /health/ready: seconds since the process started, status, reason."""

    at_s: float
    status: int | None  # None: nothing listening yet
    reason: str = ""


@dataclass
class WorkerProc:
    """One worker process; `start()` returns at once, `wait_ready()` polls and records."""

    workdir: Path
    worker_id: str
    kafka_bootstrap: str | None = None
    topic_prefix: str = ""
    api_key: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    probes: list[Probe] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"worker-{self.worker_id}.log"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self) -> WorkerProc:
        env = {**os.environ, "RAGWARM_WORKER_THREADS": "2", **self.env}
        args = ["worker", "--port", str(self.port), "--worker-id", self.worker_id, *self.args]
        if self.kafka_bootstrap:
            env["RAGWARM_KAFKA_BOOTSTRAP"] = self.kafka_bootstrap
            env["RAGWARM_KAFKA_TOPIC_PREFIX"] = self.topic_prefix
        else:
            args.append("--no-kafka")
        if self.api_key:
            env["RAGWARM_WORKER_API_KEY"] = self.api_key
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(RAGWARM), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        STARTED.append(self)
        return self

    def probe(self) -> Probe:
        at = time.monotonic() - self.started_at
        try:
            response = httpx.get(f"{self.url}/health/ready", timeout=2.0)
        except httpx.HTTPError:
            return Probe(at, None)
        return Probe(at, response.status_code, response.json().get("reason", ""))

    def wait_ready(self, timeout_s: float = 240.0) -> WorkerProc:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            probe = self.probe()
            self.probes.append(probe)
            if probe.status == 200:
                return self
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout_s} s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers, timeout=120.0, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=self.headers, timeout=300.0, **kw)


def metric(text: str, name: str) -> float:
    """Sum of a sample's values (all labels) in a Prometheus exposition; 0 when absent."""
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def completion(worker: WorkerProc, prompt: list[int] | str, tenant: str, **kw) -> dict:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "tenant": tenant, **kw}
    response = worker.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def labelled(text: str, name: str, label: str) -> float:
    """One labelled sample of a Prometheus exposition; 0 when absent."""
    for line in text.splitlines():
        sample, _, value = line.partition(" ")
        if sample == f"{name}{{{label}}}":
            return float(value)
    return 0.0
