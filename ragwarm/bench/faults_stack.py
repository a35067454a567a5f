"""`bench faults`, the stack it breaks: a broker of its own, the streams app and two workers,
each a separate process (the stack's `Proc`), and the faults done to them."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from ragwarm.bench.faults_plan import log_marks
from ragwarm.kafka.local import LocalKafka, LocalKafkaSettings
from ragwarm.ports import free_port
from ragwarm.settings import HomeSettings, KafkaSettings
from ragwarm.stack.procs import Proc, excerpt

Say = Callable[[str], None]
APP_ID = "faults-streams"
OUTAGE_S = 10.0  # the index is unwritable this long (the figure)


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
    """The broker, the streams app's instances (one consumer group; each with its disk under a
    "host" folder that a host move swaps for an empty one) and workers w1, w2. Instance 0 is
    the one whose index the end reads and the store outage locks."""

    def __init__(self, broker: LocalKafka, workdir: Path, llm_path: Path, say: Say,
                 disk_tier: bool = False, streams: int = 1):
        self.broker, self.workdir, self.say = broker, workdir, say
        self.disk_tier = disk_tier
        self.kafka = broker.kafka
        base = {"RAGWARM_KAFKA_BOOTSTRAP": self.kafka.servers, "RAGWARM_KAFKA_TOPIC_PREFIX": ""}
        self.instances: list[Proc] = []
        self.urls: list[str] = []
        self.hosts: list[int] = []
        for n in range(streams):
            port = free_port()
            self.urls.append(f"http://127.0.0.1:{port}")
            # Info: the log's timestamps say where a restart's time goes (`plan.log_marks`).
            self.instances.append(Proc(
                f"faults-streams{n or ''}", ["streams", "--loglevel", "info"], workdir,
                f"{self.urls[n]}/ragwarm/health", base | {
                    "RAGWARM_MODEL_LLM_PATH": str(llm_path),
                    "RAGWARM_STREAMS_APP_ID": APP_ID,
                    "RAGWARM_STREAMS_WEB_PORT": str(port),
                    "RAGWARM_STREAMS_HOT_TICK_S": "1.0",
                }))
            self.hosts.append(0)
            self._use_host(n, 0)
        self.streams, self.streams_url = self.instances[0], self.urls[0]
        self.kills = 0  # streams kills so far: they go round the instances
        self.workers = [self._worker(f"w{i}", base) for i in (1, 2)]
        self.recoveries: list[float] = []
        # Per streams kill: (seconds after the kill, the ready probe's state) at each change.
        self.recovery_phases: list[list[tuple[float, str]]] = []
        self.recovery_marks: list[dict[str, float]] = []  # its log's marks, per kill
        self.worker_phases: list[list[tuple[float, str]]] = []  # per worker kill, as above

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

    def home(self, n: int = 0) -> Path:
        return self.workdir / f"host-{self.hosts[n]}" / f"streams{n}"

    @property
    def qdrant_dir(self) -> Path:
        return self.home(0) / "qdrant"

    def _use_host(self, n: int, host: int) -> None:
        self.hosts[n] = host
        home = self.home(n)
        self.instances[n].env = self.instances[n].env | {
            "RAGWARM_HOME": str(home),
            "RAGWARM_QDRANT_PATH": str(home / "qdrant"),
            "RAGWARM_STREAMS_DATA_DIR": str(home / "faust"),
        }

    # --- start, probe, stop --------------------------------------------------------------
    def start(self, timeout_s: float) -> None:
        self.broker.start()
        from ragwarm.kafka.admin import create_topics
        from schemas.topics import prefixed

        create_topics(self.kafka.servers, self.kafka.client_options(), prefixed(""))
        for instance in self.instances:
            instance.start()
        for n in range(len(self.instances)):
            self.wait_ready(timeout_s, n=n)
        for worker in self.workers:
            worker.start()
        for worker in self.workers:
            worker.wait_healthy(timeout_s)
        self.say(f"stack up: broker, {len(self.instances)} streams instance(s), workers w1 and w2")

    def streams_state(self, n: int = 0) -> str:
        """What instance `n`'s ready probe says: `ready`, its reason not to be, or `down`."""
        try:
            response = httpx.get(f"{self.urls[n]}/ragwarm/health/ready", timeout=5)
        except httpx.HTTPError:
            return "down"
        return probe_state(response)

    def wait_ready(self, timeout_s: float, since: float | None = None, n: int = 0) -> None:
        """Wait for instance `n`'s ready probe; with `since`, record when its state changed."""
        deadline = time.monotonic() + timeout_s
        timeline: list[tuple[float, str]] = []
        proc = self.instances[n]
        while (state := self.streams_state(n)) != "ready":
            if since is not None and (not timeline or timeline[-1][1] != state):
                timeline.append((time.monotonic() - since, state))
            if proc.pid() is None:
                raise RuntimeError(f"{proc.name} exited:\n{excerpt(proc.log_file)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{proc.name} not ready after {timeout_s:.0f} s")
            time.sleep(0.5)
        if since is not None:
            self.recovery_phases.append([*timeline, (time.monotonic() - since, "ready")])

    def get(self, path: str) -> dict:
        """`path` from instance 0 (views of tables every instance holds whole)."""
        return self.get_all(path, self.urls[:1])[0]

    def get_all(self, path: str, urls: list[str] | None = None) -> list[dict]:
        """`path` from every instance: each serves its own partitions of a partitioned table.
        Raises `httpx.HTTPError` when one does not answer (its share would be missing)."""
        out = []
        for url in urls or self.urls:
            response = httpx.get(f"{url}{path}", timeout=30)
            response.raise_for_status()
            out.append(response.json())
        return out

    def worker_cache(self, worker: Proc) -> list[dict]:
        url = worker.health_url.removesuffix("/health/ready")
        try:
            response = httpx.get(f"{url}/v1/cache", timeout=30)
            return list(response.json().get("items") or []) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return []

    def commands_behind(self) -> dict[str, int]:
        """Per worker, the `warmup.commands` records its group has not committed: 0 means
        every invalidation sent so far has run there."""
        from ragwarm.kafka.admin import commands_behind

        ids = {w.name.removeprefix("faults-"): w.name for w in self.workers}
        kafka = self.kafka.model_copy(update={"topic_prefix": ""})  # as its workers run
        return {ids[w]: n for w, n in commands_behind(kafka, ids).items()}

    def wait_commands_applied(self, timeout_s: float = 120.0) -> None:
        """Wait until each worker has committed `warmup.commands` to its end: a fixed grace
        alone counted an invalidation still on its way (after a broker restart the workers'
        consumers reconnect late) as lost."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                behind = {w: n for w, n in self.commands_behind().items() if n > 0}
            except Exception as exc:  # noqa: BLE001 - the broker reconnecting: ask again
                behind = {"?": 1}
                self.say(f"  could not read the workers' offsets yet: {exc}")
            if not behind:
                return
            if time.monotonic() > deadline:
                self.say(f"workers still behind on warmup.commands after {timeout_s:.0f} s: "
                         f"{behind}")
                return
            time.sleep(1.0)

    def stop(self) -> None:
        for proc in [*self.workers, *self.instances]:
            proc.stop()
        self.broker.stop(force=True)

    # --- the faults ----------------------------------------------------------------------
    def kill_streams(self, timeout_s: float, move_host: bool = False) -> tuple[str, float]:
        """SIGKILL a streams instance (the next in turn) and start it again (on an empty disk
        when `move_host`); its name and the seconds from the kill to its ready probe's 200."""
        n = self.kills % len(self.instances)
        self.kills += 1
        proc = self.instances[n]
        t0, wall = time.monotonic(), time.time()
        logged = proc.log_file.stat().st_size if proc.log_file.exists() else 0
        _sigkill(proc)
        if move_host:
            self._use_host(n, max(self.hosts) + 1)
        proc.start()
        self.wait_ready(timeout_s, since=t0, n=n)
        took = time.monotonic() - t0
        with proc.log_file.open("rb") as log:
            log.seek(logged)
            text = log.read().decode("utf-8", "replace")
        self.recovery_marks.append(log_marks(text.splitlines(), wall))
        self.recoveries.append(took)
        return proc.name, took

    def kill_worker(self, worker: Proc, timeout_s: float) -> None:
        """SIGKILL one worker and start it again with the same id; records its ready probe's
        reasons on the way (`worker_phases`: seconds after the kill at each change)."""
        t0 = time.monotonic()
        _sigkill(worker)
        worker.start()
        timeline: list[tuple[float, str]] = []
        while (state := worker_state(worker)) != "ready":
            if not timeline or timeline[-1][1] != state:
                timeline.append((time.monotonic() - t0, state))
            if worker.pid() is None or time.monotonic() > t0 + timeout_s:
                worker.wait_healthy(0)  # raises, with the tail of its log
            time.sleep(0.25)
        self.worker_phases.append([*timeline, (time.monotonic() - t0, "ready")])

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


def worker_state(worker: Proc) -> str:
    """What a worker's ready probe says: `ready`, its reason not to be, or `down`."""
    try:
        response = httpx.get(worker.health_url, timeout=5)
    except httpx.HTTPError:
        return "down"
    return probe_state(response)


def probe_state(response: httpx.Response) -> str:
    if response.status_code == 200:
        return "ready"
    try:
        return str(response.json().get("reason") or response.status_code)
    except ValueError:
        return str(response.status_code)


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
                   if any(v.get("state") is not None
                          for v in self.stack.get_all(f"/ragwarm/prefixes/{h}"))}
        self.missing = tracked - now

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
