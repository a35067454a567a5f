"""Process and port probes of the local broker: is a pid alive, a kafka.Kafka JVM, a port open."""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = "127.0.0.1"


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, or a note that there is none."""
    if not path.exists():
        return f"(no log at {path})"
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return "\n".join(text)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        # A zombie still answers kill(0) but is gone for our purposes.
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def is_kafka(pid: int) -> bool:
    """Guards against a recycled pid: the process must be a kafka.Kafka JVM."""
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc").is_dir() and pid_alive(pid)
    except OSError:
        return False


def port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False
