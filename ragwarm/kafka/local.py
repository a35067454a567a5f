"""The local one-node Apache Kafka (KRaft) broker: jars from Maven Central, start, stop, status."""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragwarm.kafka.admin import probe
from ragwarm.kafka.processes import is_kafka, log_tail, pid_alive, port_open
from ragwarm.progress import waiting
from ragwarm.settings import HomeSettings, KafkaSettings, infra_dir

HOST = "127.0.0.1"
Say = Callable[[str], None]


class LocalKafkaSettings(BaseSettings):
    """How the local broker is launched (the connection itself is `KafkaSettings`)."""

    model_config = SettingsConfigDict(env_prefix="RAGWARM_KAFKA_", extra="forbid")

    jars_dir: Path | None = Field(
        default=None,
        description="Folder holding lib-<version> jar folders; default <RAGWARM_HOME>/kafka. "
        "Lets a throwaway RAGWARM_HOME share jars already fetched.",
    )
    heap: str = Field(default="512m", description="Maximum JVM heap of the broker (-Xmx).")
    maven: str = Field(default="mvn", description="Maven executable used to fetch the jars.")


class KafkaLaunchError(RuntimeError):
    """The local broker could not be fetched, formatted, started or stopped."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def new_cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes, URL-safe base64 without padding."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # Kafka's own generator avoids a leading '-' so the id never reads as a CLI flag.
        if not cid.startswith("-"):
            return cid


def server_properties(
    kafka: KafkaSettings, data_dir: Path, overrides: dict[str, str] | None = None
) -> str:
    """The broker+controller configuration of a one-node KRaft cluster on 127.0.0.1."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://{HOST}:{kafka.port},CONTROLLER://{HOST}:{kafka.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{kafka.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.quorum.bootstrap.servers": f"{HOST}:{kafka.controller_port}",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        # One node: every internal topic must live with a single replica.
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Fewer internal partitions: creating 50 of each is slow on a small dev machine.
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.num.partitions": "8",
        # Consumers in tests and demos join at once; the default 3 s delay only slows them.
        "group.initial.rebalance.delay.ms": "0",
        **(overrides or {}),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


class LocalKafka:
    """Manages one local broker under `HomeSettings.kafka_dir`; a no-op with an external cluster."""

    mode = "plaintext"  # what listener it opens; see ragwarm.kafka.secure for "secure"

    def __init__(
        self,
        home: HomeSettings,
        kafka: KafkaSettings,
        local: LocalKafkaSettings | None = None,
        say: Say = _stderr,
    ) -> None:
        self.home, self.kafka = home, kafka
        self.local = local or LocalKafkaSettings()
        self.say = say
        self._proc: subprocess.Popen[bytes] | None = None
        # Several contexts in one process each hold their own lease.
        self._lease = self.home.run_dir / "kafka-users" / f"{os.getpid()}.{uuid.uuid4().hex[:8]}"

    # --- where things live -------------------------------------------------------------
    @property
    def version(self) -> str:
        return self.kafka.version

    @property
    def bootstrap(self) -> str:
        return self.kafka.servers

    @property
    def external(self) -> bool:
        return self.kafka.bootstrap is not None

    @property
    def dir(self) -> Path:
        return self.home.kafka_dir

    @property
    def jars_dir(self) -> Path:
        return (self.local.jars_dir or self.dir) / f"lib-{self.version}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def log_file(self) -> Path:
        return self.dir / "broker.out"

    @property
    def pid_file(self) -> Path:
        return self.home.run_dir / "kafka.pid"

    @property
    def _managed_file(self) -> Path:
        return self.home.run_dir / "kafka.managed"

    @property
    def _mode_file(self) -> Path:
        return self.home.run_dir / "kafka.mode"

    def _check_mode(self) -> None:
        """A running broker of the other kind is an error, unless the client can log in to it."""
        running = self._mode_file.read_text() if self._mode_file.exists() else "plaintext"
        if running != self.mode and not (running == "secure" and self.kafka.uses_sasl):
            raise KafkaLaunchError(
                f"a {running} broker runs already at {self.bootstrap}; stop it first "
                "(`ragwarm kafka stop --force`)"
                + (", or export the settings `ragwarm kafka start --secure` printed"
                   if running == "secure" else "")
            )

    # --- jars --------------------------------------------------------------------------
    def ensure_jars(self) -> Path:
        """Fetch the broker's jars with Maven once; later calls reuse the folder."""
        lib = self.jars_dir
        if (lib / f"kafka_2.13-{self.version}.jar").exists():
            return lib
        mvn = shutil.which(self.local.maven)
        if mvn is None:
            raise KafkaLaunchError(
                f"Maven ({self.local.maven}) is needed once to fetch the Kafka {self.version} jars "
                f"into {lib}: install it (apt-get install maven), or set RAGWARM_KAFKA_JARS_DIR "
                "to a folder that has lib-<version>, or RAGWARM_KAFKA_BOOTSTRAP to a cluster."
            )
        part = lib.with_name(lib.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        self.say(f"Fetching Apache Kafka {self.version} jars from Maven Central into {lib} ...")
        began = time.monotonic()
        self._run_maven(mvn, part)
        if not (part / f"kafka_2.13-{self.version}.jar").exists():
            raise KafkaLaunchError(f"Maven finished but kafka_2.13-{self.version}.jar is missing")
        part.rename(lib)
        jars = list(lib.glob("*.jar"))
        size_mb = sum(j.stat().st_size for j in jars) / 1e6
        self.say(f"{len(jars)} jars, {size_mb:.0f} MB, in {time.monotonic() - began:.0f} s")
        return lib

    def _run_maven(self, mvn: str, out: Path) -> None:
        cmd = [
            mvn, "-B", "-f", str(infra_dir("kafka") / "pom.xml"),
            f"-Dmaven.repo.local={self.dir / 'm2'}", f"-Dkafka.version={self.version}",
            "dependency:copy-dependencies", f"-DoutputDirectory={out}",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("Downloaded from") and ".jar " in line:
                name = line.split("/")[-1].strip()
                self.say(f"  downloaded {name}")
        if proc.wait() != 0:
            errors = [ln for ln in lines if "ERROR" in ln][:15] or lines[-15:]
            raise KafkaLaunchError(
                f"Maven could not fetch Apache Kafka {self.version} (is that version published? "
                "is Maven Central reachable?):\n" + "\n".join(errors)
            )

    # --- storage -----------------------------------------------------------------------
    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise KafkaLaunchError(
                "Java 17 or newer is needed for the local Kafka broker (apt-get install "
                "openjdk-17-jre-headless), or set RAGWARM_KAFKA_BOOTSTRAP to an existing cluster."
            )
        return java

    def _jvm(self, lib: Path, heap: str) -> list[str]:
        return [
            self._java(), f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={infra_dir('kafka') / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.dir / 'logs'}", "-cp", f"{lib}/*",
        ]  # fmt: skip

    def _write_config(self) -> Path:
        path = self.dir / "server.properties"
        path.unlink(missing_ok=True)
        # 0600: a secured broker's config holds its keystore and SCRAM passwords.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(server_properties(self.kafka, self.data_dir, self._config_overrides()))
        return path

    def _config_overrides(self) -> dict[str, str]:
        return {}

    def _format_args(self) -> list[str]:
        return []

    def _probe_options(self) -> dict[str, object]:
        return self.kafka.client_options()

    def _cluster_id(self) -> str:
        path = self.dir / "cluster.id"
        if not path.exists():
            path.write_text(new_cluster_id() + "\n")
        return path.read_text().strip()

    def _ensure_formatted(self, lib: Path, config: Path) -> None:
        """Format the data folder once (KRaft needs it); later starts reuse it."""
        if (self.data_dir / "meta.properties").exists():
            return
        self.say(f"Formatting Kafka storage in {self.data_dir}")
        cmd = self._jvm(lib, "256m") + [
            "kafka.tools.StorageTool", "format", "--standalone",
            "-t", self._cluster_id(), "-c", str(config), *self._format_args(),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise KafkaLaunchError(f"kafka storage format failed:\n{done.stdout}{done.stderr}")

    # --- process -----------------------------------------------------------------------
    def running_pid(self) -> int | None:
        """The pid of the local broker if its pid file names a live kafka.Kafka process."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) and is_kafka(pid) else None

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Serializes start/stop between processes sharing this RAGWARM_HOME."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.home.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def start(self) -> bool:
        """Start the broker unless it runs already; True when this call started it."""
        if self.external:
            self.say(f"RAGWARM_KAFKA_BOOTSTRAP is set: using {self.bootstrap}, nothing started.")
            return False
        with self._lock():
            # Someone asked for it by hand: it now outlives the test sessions sharing it.
            self._managed_file.unlink(missing_ok=True)
            return self._start_locked()

    def _start_locked(self) -> bool:
        pid = self.running_pid()
        if pid is not None:
            self._check_mode()
            self._wait_ready(pid)
            self.say(f"Kafka already running at {self.bootstrap} (pid {pid}).")
            return False
        self.pid_file.unlink(missing_ok=True)
        for port in (self.kafka.port, self.kafka.controller_port):
            if port_open(port):
                raise KafkaLaunchError(
                    f"port {port} is taken by another process; free it or set RAGWARM_KAFKA_PORT"
                    " / RAGWARM_KAFKA_CONTROLLER_PORT (or RAGWARM_KAFKA_BOOTSTRAP)"
                )
        self._launch()
        self.say(f"Kafka {self.version} started at {self.bootstrap} (pid {self._pid()}).")
        return True

    def _launch(self) -> None:
        lib = self.ensure_jars()
        config = self._write_config()
        self._ensure_formatted(lib, config)
        cmd = self._jvm(lib, self.local.heap) + ["kafka.Kafka", str(config)]
        with open(self.log_file, "wb") as out:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.dir, start_new_session=True,
            )  # fmt: skip
        self.pid_file.write_text(f"{self._proc.pid}\n")
        self._mode_file.write_text(self.mode)
        try:
            self._wait_ready(self._proc.pid)
        except KafkaLaunchError:
            self._kill(self._proc.pid, signal.SIGKILL, 10.0)
            self.pid_file.unlink(missing_ok=True)
            raise

    def _pid(self) -> int | None:
        return self._proc.pid if self._proc else self.running_pid()

    def _wait_ready(self, pid: int) -> None:
        """Wait until the broker answers a metadata request, or fail with its log."""
        deadline = time.monotonic() + self.kafka.start_timeout_s
        what = f"kafka: waiting for the broker (pid {pid}) to answer at {self.bootstrap}"
        with waiting(what, limit_s=self.kafka.start_timeout_s):
            while time.monotonic() < deadline:
                if not pid_alive(pid):
                    raise KafkaLaunchError(
                        f"the Kafka broker (pid {pid}) exited while starting; last lines of "
                        f"{self.log_file}:\n{log_tail(self.log_file)}"
                    )
                if port_open(self.kafka.port) and probe(self.bootstrap, self._probe_options(), 5):
                    return
                time.sleep(0.5)
        raise KafkaLaunchError(
            f"the Kafka broker (pid {pid}) did not answer at {self.bootstrap} within "
            f"{self.kafka.start_timeout_s:.0f} s; last lines of {self.log_file}:\n"
            f"{log_tail(self.log_file)}\n(more in {self.dir / 'logs' / 'server.log'})"
        )

    def stop(self, force: bool = False) -> bool:
        """Stop the local broker; False (and no error) when none was running.

        While test sessions or services hold it (`with LocalKafka(...)`), it is only marked
        to stop when the last of them exits, unless `force`.
        """
        if self.external:
            self.say(f"RAGWARM_KAFKA_BOOTSTRAP is set ({self.bootstrap}): nothing to stop.")
            return False
        with self._lock():
            users = sorted({p.name.split(".")[0] for p in self._live_leases()})
            if users and not force and self.running_pid() is not None:
                self._managed_file.touch()
                self.say(
                    f"Kafka is in use by process(es) {', '.join(users)}: it stops when the last "
                    "of them exits (`ragwarm kafka stop --force` stops it now)."
                )
                return False
            return self._stop_locked()

    def _stop_locked(self) -> bool:
        pid = self.running_pid()
        self._managed_file.unlink(missing_ok=True)
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            self.say("Kafka is not running.")
            return False
        if not self._kill(pid, signal.SIGTERM, self.kafka.stop_timeout_s):
            self.say(f"Kafka (pid {pid}) ignored SIGTERM for {self.kafka.stop_timeout_s:.0f} s")
            if not self._kill(pid, signal.SIGKILL, 10.0):
                raise KafkaLaunchError(f"could not kill the Kafka broker (pid {pid})")
        self.pid_file.unlink(missing_ok=True)
        self.say(f"Kafka stopped (pid {pid}).")
        return True

    def _kill(self, pid: int, sig: signal.Signals, wait_s: float) -> bool:
        """Send `sig` and wait up to `wait_s` for the process to be gone."""
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    return True
            elif not pid_alive(pid):
                return True
            time.sleep(0.1)
        return False

    def status(self) -> dict[str, object]:
        """Whether the broker runs, with its pid, bootstrap, version and folders."""
        if self.external:
            up = probe(self.bootstrap, self.kafka.client_options(), 5.0) is not None
            return {"running": up, "external": True, "bootstrap": self.bootstrap}
        pid = self.running_pid()
        return {
            "running": pid is not None and port_open(self.kafka.port),
            "external": False,
            "pid": pid,
            "bootstrap": self.bootstrap,
            "version": self.version,
            "data_dir": str(self.data_dir),
            "log": str(self.log_file),
            "jars": str(self.jars_dir),
            "users": sorted({int(p.name.split(".")[0]) for p in self._live_leases()}),
        }

    # --- shared use by test sessions and the stack -------------------------------------
    def __enter__(self) -> str:
        """Start if needed and register this process as a user of the broker."""
        if self.external:
            return self.bootstrap
        with self._lock():
            started = self._start_locked()
            if started:
                self._managed_file.touch()
            self._lease.parent.mkdir(parents=True, exist_ok=True)
            self._lease.touch()
        return self.bootstrap

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the broker if a context user started it and no other user is left."""
        if self.external:
            return
        with self._lock():
            self._lease.unlink(missing_ok=True)
            if self._managed_file.exists() and not self._live_leases():
                self._stop_locked()

    def _live_leases(self) -> list[Path]:
        """Leases of processes still alive; those of crashed processes are removed."""
        live = []
        for lease in self._lease.parent.glob("*.*"):
            pid = lease.name.split(".")[0]
            if pid.isdigit() and pid_alive(int(pid)):
                live.append(lease)
            else:
                lease.unlink(missing_ok=True)
        return live
