"""Starts the streams app as a separate process in its own topic namespace, for tests."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from ragwarm.ports import free_port
from ragwarm.stack.procs import Proc
from tests.integration.waiting import wait_for

# Every streams app started by tests (see worker_proc.STARTED).
STARTED: list[StreamsApp] = []


class StreamsApp:
    """`ragwarm streams` with its own app id, Qdrant path and web port."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        app_id: str,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        loglevel: str = "warning",
    ):
        self.topic_prefix = prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            "RAGWARM_KAFKA_BOOTSTRAP": bootstrap,
            "RAGWARM_KAFKA_TOPIC_PREFIX": prefix,
            # Changelog topics are named after the app id: keep them in the namespace too.
            "RAGWARM_STREAMS_APP_ID": prefix + app_id,
            "RAGWARM_STREAMS_WEB_PORT": str(self.port),
            "RAGWARM_QDRANT_PATH": str(workdir / f"qdrant-{app_id}"),
            "RAGWARM_STREAMS_DATA_DIR": str(workdir / f"faust-{app_id}"),
            "RAGWARM_STREAMS_HOT_TICK_S": "1.0",
            **(extra_env or {}),
        }
        key = env.get("RAGWARM_STREAMS_API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.proc = Proc(
            f"streams-{app_id}",
            ["streams", "--loglevel", loglevel],
            workdir,
            f"{self.url}/ragwarm/health",
            env,
        )

    def start(self, timeout_s: float = 180.0) -> StreamsApp:
        STARTED.append(self)
        self.proc.start()
        self.proc.wait_healthy(timeout_s)
        return self

    def get(self, path: str) -> dict:
        response = httpx.get(self.url + path, timeout=10.0, headers=self.headers)
        response.raise_for_status()
        return response.json()

    def counters(self) -> dict:
        return self.get("/ragwarm/stats")["counters"]

    def stop(self) -> None:
        self.proc.stop()


def wait_ready(app: StreamsApp, timeout_s: float = 240) -> float:
    """Poll /ragwarm/health/ready until 200; the seconds it took."""
    t0 = time.monotonic()

    def ready() -> bool:
        try:
            return httpx.get(app.url + "/ragwarm/health/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout_s, "/ragwarm/health/ready to answer 200")
    return time.monotonic() - t0
