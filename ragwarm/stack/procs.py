"""Background processes of the local stack: start with a log and pid file, probe, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ragwarm.progress import waiting


@dataclass
class Proc:
    """One ragwarm service run as `python -m ragwarm.cli <args>` in its own session."""

    name: str
    args: list[str]
    run_dir: Path
    health_url: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    @property
    def port(self) -> int:
        return urlsplit(self.health_url).port or 80

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid if not _is_zombie(pid) else None

    def start(self) -> bool:
        """Start unless running; False when it already was."""
        if self.pid() is not None:
            return False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_file.open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ragwarm.cli", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        self.pid_file.write_text(str(proc.pid))
        return True

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return httpx.get(self.health_url, timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with waiting(f"{self.name}: waiting for {self.health_url}", limit_s=timeout_s):
            while time.monotonic() < deadline:
                if self.healthy():
                    return
                if self.pid() is None:
                    log = excerpt(self.log_file)
                    raise RuntimeError(f"{self.name} exited during start:\n{log}")
                time.sleep(0.5)
        raise TimeoutError(
            f"{self.name} not healthy after {timeout_s:.0f} s:\n{excerpt(self.log_file)}"
        )

    def stop(self, grace_s: float = 20.0) -> bool:
        """SIGTERM the process group, SIGKILL after `grace_s`; False when nothing ran."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            _signal_group(pid, signal.SIGKILL)
            time.sleep(0.5)
        self.pid_file.unlink(missing_ok=True)
        return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _is_zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)  # reap our own child so it stops counting as alive
        except ChildProcessError:
            pass
        return True
    return False


def port_conflicts(procs: list[Proc]) -> list[str]:
    """Why `procs` could not all bind their ports: two given the same one, or one held by
    another process. Found before anything starts: a service that lost its port exits a
    few seconds into a start whose health probes meanwhile reach the wrong service."""
    problems: list[str] = []
    owner: dict[int, str] = {}
    for proc in procs:
        if proc.port in owner:
            problems.append(f"{owner[proc.port]} and {proc.name} are both given port {proc.port}")
        elif _listening(proc.port):
            problems.append(f"port {proc.port} of {proc.name} is in use by another process")
        owner.setdefault(proc.port, proc.name)
    return problems


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def excerpt(path: Path, lines: int = 30) -> str:
    """The log's first error with what follows, then its last lines: a crashed service's
    shutdown chatter would otherwise push the reason out of a plain tail."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    first = next((i for i, line in enumerate(text)
                  if "Traceback" in line or "[ERROR]" in line or "Error:" in line), None)
    if first is None or first >= len(text) - lines:
        return "\n".join(text[-lines:])
    return "\n".join([*text[first:first + lines], "...", *text[-10:]])


def operator_headers(component: str) -> dict[str, str]:
    """The operator key of `streams` or `worker` as a header: RAGWARM_<COMPONENT>_API_KEY,
    else the key `ragwarm up` generated under RAGWARM_HOME (the one it gave the services).

    The stack reads state views (stats, cache, workers) that need an operator key when
    the services were started with one.
    """
    from ragwarm.settings import HomeSettings
    from ragwarm.stack.keys import load
    from streams.settings import StreamsSettings
    from workers.settings import WorkerSettings

    settings = StreamsSettings() if component == "streams" else WorkerSettings()
    if settings.api_key is not None:
        return bearer(settings.api_key.get_secret_value())
    stored = load(HomeSettings().keys_dir)
    return bearer(stored.operator) if stored else {}


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
