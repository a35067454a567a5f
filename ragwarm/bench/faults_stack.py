"""`bench faults`, the stack it breaks: a broker of its own, the streams app and two workers,
each a separate process (the stack's `Proc`), and the faults done to them."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from ragwarm.bench.faults_plan import log_marks
from ragwarm.kafka.local import LocalKafka, LocalKafkaSettings
from ragwarm.settings import HomeSettings, KafkaSettings
from ragwarm.stack.procs import Proc

Say = Callable[[str], None]
APP_ID = "faults-streams"
OUTAGE_S = 10.0  # the index is unwritable this long (the figure)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_broker(workdir: Path, say: Say) -> LocalKafka:
    """A one-node broker with its own ports and data under `workdir`: stopping it touches
    nobody else's (never the shared one). Jars come from the shared broker's folder."""
    shared = LocalKafka(HomeSettings(), KafkaSettings(bootstrap=None), say=say)
    shared.ensure_jars()
    home = HomeSettings(home=workdir / "broker-home")
    home.kafka_dir.mkdir(parents=True, exist_ok=True)
    kafka = KafkaSettings(bootstrap=None, port=free_port(), controller_port=free_port(),
                          topic_prefix="")
    return LocalKafka(home, kafka, LocalKafkaSettings(jars_dir=shared.jars_dir.parent), say=say)


class FaultStack:
    """The broker, the streams app (its disk under a "host" folder that a host move swaps
    for an empty one) and workers w1, w2."""

    def __init__(self, broker: LocalKafka, workdir: Path, llm_path: Path, say: Say,
                 disk_tier: bool = False):
        self.broker, self.workdir, self.say = broker, workdir, say
        self.disk_tier = disk_tier
        self.kafka = broker.kafka
        base = {"RAGWARM_KAFKA_BOOTSTRAP": self.kafka.servers, "RAGWARM_KAFKA_TOPIC_PREFIX": ""}
        port = free_port()
        self.streams_url = f"http://127.0.0.1:{port}"
        self.host = 0
        # Info: the log's timestamps say where a restart's time goes (`plan.log_marks`).
        self.streams = Proc("faults-streams", ["streams", "--loglevel", "info"], workdir,
                            f"{self.streams_url}/ragwarm/health", base | {
                                "RAGWARM_MODEL_LLM_PATH": str(llm_path),
                                "RAGWARM_STREAMS_APP_ID": APP_ID,
                                "RAGWARM_STREAMS_WEB_PORT": str(port),
                                "RAGWARM_STREAMS_HOT_TICK_S": "1.0",
                            })
        self._use_host(0)
        self.workers = [self._worker(f"w{i}", base) for i in (1, 2)]
        self.recoveries: list[float] = []
        # Per streams kill: (seconds after the kill, the ready probe's state) at each change.
        self.recovery_phases: list[list[tuple[float, str]]] = []
        self.recovery_marks: list[dict[str, float]] = []  # its log's marks, per kill

    def _worker(self, worker_id: str, base: dict[str, str]) -> Proc:
        port = free_port()
        # No reactive caching of answered prompts: every entry a worker holds was sent by
        # the pipeline with its chunk refs, so a stale one is the pipeline's miss.
        env = base | {"RAGWARM_WORKER_HEARTBEAT_S": "1", "RAGWARM_WORKER_CACHE_REQUESTS": "false"}
        if self.disk_tier:  # a restarted worker serves its tier at once (issue 40)
            env |= {"RAGWARM_WORKER_DISK_TIER": "true",
                    "RAGWARM_WORKER_DISK_TIER_PATH": str(self.workdir / "kv-tier" / worker_id)}
        return Proc(f"faults-{worker_id}", ["worker", "--worker-id", worker_id, "--port",
                                            str(port)],
                    self.workdir, f"http://127.0.0.1:{port}/health/ready", env)

    @property
    def home(self) -> Path:
        return self.workdir / f"host-{self.host}"

    @property
    def qdrant_dir(self) -> Path:
        return self.home / "qdrant"

    def _use_host(self, n: int) -> None:
        self.host = n
        self.streams.env = self.streams.env | {
            "RAGWARM_HOME": str(self.home),
            "RAGWARM_QDRANT_PATH": str(self.qdrant_dir),
            "RAGWARM_STREAMS_DATA_DIR": str(self.home / "faust"),
        }

    # --- start, probe, stop --------------------------------------------------------------
    def start(self, timeout_s: float) -> None:
        self.broker.start()
        from ragwarm.kafka.admin import create_topics
        from schemas.topics import prefixed

        create_topics(self.kafka.servers, self.kafka.client_options(), prefixed(""))
        self.streams.start()
        self.wait_ready(timeout_s)
        for worker in self.workers:
            worker.start()
        for worker in self.workers:
            worker.wait_healthy(timeout_s)
        self.say("stack up: broker, streams app, workers w1 and w2")

    def streams_ready(self) -> bool:
        return self.streams_state() == "ready"

    def streams_state(self) -> str:
        """What the ready probe says: `ready`, its reason not to be, or `down` (no answer)."""
        try:
            response = httpx.get(f"{self.streams_url}/ragwarm/health/ready", timeout=5)
        except httpx.HTTPError:
            return "down"
        if response.status_code == 200:
            return "ready"
        try:
            return str(response.json().get("reason") or response.status_code)
        except ValueError:
            return str(response.status_code)

    def wait_ready(self, timeout_s: float, since: float | None = None) -> None:
        """Wait for the ready probe; with `since`, record when its state changed after it."""
        deadline = time.monotonic() + timeout_s
        timeline: list[tuple[float, str]] = []
        while (state := self.streams_state()) != "ready":
            if since is not None and (not timeline or timeline[-1][1] != state):
                timeline.append((time.monotonic() - since, state))
            if self.streams.pid() is None:
                from ragwarm.stack.procs import tail

                raise RuntimeError(f"the streams app exited:\n{tail(self.streams.log_file)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the streams app not ready after {timeout_s:.0f} s")
            time.sleep(0.5)
        if since is not None:
            self.recovery_phases.append([*timeline, (time.monotonic() - since, "ready")])

    def get(self, path: str) -> dict:
        response = httpx.get(f"{self.streams_url}{path}", timeout=30)
        response.raise_for_status()
        return response.json()

    def worker_cache(self, worker: Proc) -> list[dict]:
        url = worker.health_url.removesuffix("/health/ready")
        try:
            response = httpx.get(f"{url}/v1/cache", timeout=30)
            return list(response.json().get("items") or []) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return []

    def stop(self) -> None:
        for proc in [*self.workers, self.streams]:
            proc.stop()
        self.broker.stop(force=True)

    # --- the faults ----------------------------------------------------------------------
    def kill_streams(self, timeout_s: float, move_host: bool = False) -> float:
        """SIGKILL the streams app and start it again (on an empty disk when `move_host`);
        the seconds from the kill to its ready probe answering 200."""
        t0, wall = time.monotonic(), time.time()
        logged = self.streams.log_file.stat().st_size if self.streams.log_file.exists() else 0
        _sigkill(self.streams)
        if move_host:
            self._use_host(self.host + 1)
        self.streams.start()
        self.wait_ready(timeout_s, since=t0)
        took = time.monotonic() - t0
        with self.streams.log_file.open("rb") as log:
            log.seek(logged)
            text = log.read().decode("utf-8", "replace")
        self.recovery_marks.append(log_marks(text.splitlines(), wall))
        self.recoveries.append(took)
        return took

    def kill_worker(self, worker: Proc, timeout_s: float) -> None:
        """SIGKILL one worker and start it again with the same id."""
        _sigkill(worker)
        worker.start()
        worker.wait_healthy(timeout_s)

    def restart_broker(self, down_s: float = 5.0) -> None:
        """Stop the broker (its data kept), wait, start it again."""
        self.broker.stop(force=True)
        time.sleep(down_s)
        self.broker.start()

    def store_outage(self, during: Callable[[], None], seconds: float = OUTAGE_S) -> None:
        """The index unwritable for `seconds`, running `during` meanwhile: this process holds
        the write lock of every SQLite file of the local store, so each write of the app
        fails with 'database is locked' (as root, permissions would not stop the writes, and
        in WAL mode a moved directory does not either). Before the store has a file, the
        directory is moved away instead."""
        databases = sorted(self.qdrant_dir.rglob("*.sqlite"))
        if not databases:
            away = self.qdrant_dir.with_name("qdrant.away")
            self.qdrant_dir.rename(away)
        locks = [sqlite3.connect(db, timeout=60, isolation_level=None) for db in databases]
        t0 = time.monotonic()
        try:
            for lock in locks:
                lock.execute("BEGIN EXCLUSIVE")
            during()
            time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        finally:
            for lock in locks:
                lock.execute("ROLLBACK")
                lock.close()
            if not databases:
                away.rename(self.qdrant_dir)


def _sigkill(proc: Proc) -> None:
    pid = proc.pid()
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 30
    while proc.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.1)


class Rewarm:
    """Waits, in the background, until a restarted worker holds again the prefixes it held
    when it was killed that the app still tracks; `seconds` from the kill, None until then."""

    def __init__(self, stack: FaultStack, worker: Proc, held: set[str], timeout_s: float):
        self.stack, self.worker, self.held = stack, worker, held
        self.t0 = time.monotonic()
        self.seconds: float | None = None
        self.missing: set[str] = set(held)
        self._thread = threading.Thread(target=self._watch, args=(timeout_s,), daemon=True)
        self._thread.start()

    def _watch(self, timeout_s: float) -> None:
        if not self.held:
            return  # nothing to get back: no figure (a 0 would claim a re-warm)
        deadline = self.t0 + timeout_s
        while time.monotonic() < deadline:
            try:
                self._check()
            except httpx.HTTPError:
                pass  # the app may be restarting; ask again
            if not self.missing:
                self.seconds = time.monotonic() - self.t0
                return
            time.sleep(1.0)

    def _check(self) -> None:
        now = {e["prefix_hash"] for e in self.stack.worker_cache(self.worker)}
        tracked = {h for h in self.missing
                   if self.stack.get(f"/ragwarm/prefixes/{h}").get("state") is not None}
        self.missing = tracked - now

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
