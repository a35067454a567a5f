"""Ports handed to the stack's processes: never the same one twice, refused before a start
that could not bind, and a crashed start's log shows its first error."""

from __future__ import annotations

import socket

from ragwarm.ports import free_port
from ragwarm.stack.procs import Proc, excerpt, port_conflicts


def proc(name: str, port: int, tmp_path) -> Proc:
    return Proc(name, [], tmp_path, f"http://127.0.0.1:{port}/health")


def test_free_port_never_repeats_within_a_process():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50


def test_two_processes_given_one_port_are_refused(tmp_path):
    port = free_port()
    problems = port_conflicts([proc("streams", port, tmp_path), proc("worker-1", port, tmp_path)])
    assert problems == [f"streams and worker-1 are both given port {port}"]


def test_a_port_held_by_another_process_is_refused(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert port_conflicts([proc("gateway", port, tmp_path)]) == [
            f"port {port} of gateway is in use by another process"]
    assert port_conflicts([proc("gateway", free_port(), tmp_path)]) == []


def test_excerpt_keeps_the_first_error_before_the_shutdown_chatter(tmp_path):
    log = tmp_path / "streams.log"
    lines = ["starting"] * 5 + ["Traceback (most recent call last):",
                                "OSError: [Errno 98] address already in use"]
    log.write_text("\n".join(lines + [f"Stopping {i}" for i in range(60)]))
    shown = excerpt(log)
    assert "Errno 98" in shown and "Stopping 59" in shown and "..." in shown
    log.write_text("\n".join(f"line {i}" for i in range(5)))
    assert excerpt(log) == "\n".join(f"line {i}" for i in range(5))
    assert excerpt(tmp_path / "missing.log") == "(no log)"
