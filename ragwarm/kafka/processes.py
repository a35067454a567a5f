"""Process and port probes of the local broker: is a pid alive, a kafka.Kafka JVM, a port open."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil

HOST = "127.0.0.1"


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, or a note that there is none."""
    if not path.exists():
        return f"(no log at {path})"
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return "\n".join(text)


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie still has its pid but is gone for our purposes."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # someone else's process: it exists
        return True


def is_kafka(pid: int) -> bool:
    """Guards against a recycled pid: the process must be a kafka.Kafka JVM."""
    try:
        return any("kafka.Kafka" in arg for arg in psutil.Process(pid).cmdline())
    except psutil.Error:  # gone, a zombie, or not ours to read: not our broker
        return False


def port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False
