"""Process probes of the local broker: a live pid, a zombie, a recycled pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from ragwarm.kafka.processes import is_kafka, pid_alive

SLEEPER = "import sys, time; time.sleep(float(sys.argv[1]))"


def test_this_process_is_alive_and_not_a_broker() -> None:
    assert pid_alive(os.getpid())
    assert not is_kafka(os.getpid())


def test_a_process_named_like_the_broker_is_one() -> None:
    with subprocess.Popen([sys.executable, "-c", SLEEPER, "30", "kafka.Kafka"]) as proc:
        try:
            # Until the child has exec'd, its command line is still this process's.
            deadline = time.monotonic() + 10
            while not is_kafka(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert is_kafka(proc.pid)
        finally:
            proc.kill()


def test_an_exited_process_is_gone_before_and_after_it_is_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "0", "kafka.Kafka"])
    deadline = time.monotonic() + 30
    while pid_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # exited but not reaped: a zombie, which counts as gone
    assert not pid_alive(proc.pid)
    assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE  # still has its pid
    proc.wait()
    assert not pid_alive(proc.pid) and not is_kafka(proc.pid)
