"""Progress of long waits: a line naming what is waited on and the seconds so far, and the
`--json` commands keep client logs off their output."""

from __future__ import annotations

import logging
import threading

from click.testing import CliRunner

from ragwarm.cli import CLIENT_LOGGERS, main
from ragwarm.progress import progress_line, waiting


def test_progress_line_names_the_wait_its_seconds_and_its_limit():
    assert progress_line("kafka: waiting for the broker", 20.4, 60) == (
        "kafka: waiting for the broker… 20 s (gives up at 60 s)")
    assert progress_line("models: converting", 9.6) == "models: converting… 10 s"


def test_waiting_writes_lines_while_the_block_runs_and_stops_after():
    lines: list[str] = []
    three = threading.Event()

    def write(line: str) -> None:
        lines.append(line)
        if len(lines) >= 3:
            three.set()

    with waiting("worker-1: waiting for /health", limit_s=180, every_s=0.01, write=write):
        assert three.wait(30)
    after = len(lines)
    assert all(line.startswith("worker-1: waiting for /health… ") for line in lines)
    assert all(line.endswith(" s (gives up at 180 s)") for line in lines)
    threading.Event().wait(0.1)
    assert len(lines) == after  # the ticker ended with the block


def test_a_wait_shorter_than_the_interval_prints_nothing():
    lines: list[str] = []
    with waiting("quick", every_s=60, write=lines.append):
        pass
    assert lines == []


def test_the_ticker_stops_when_the_block_raises():
    lines: list[str] = []
    try:
        with waiting("failing", every_s=60, write=lines.append):
            raise TimeoutError("gave up")
    except TimeoutError:
        pass
    assert not any(t.name == "ragwarm-progress" for t in threading.enumerate())


def _levels() -> dict[str, int]:
    return {name: logging.getLogger(name).level for name in CLIENT_LOGGERS}


def test_a_json_command_silences_the_client_loggers():
    before = _levels()
    try:
        assert CliRunner().invoke(main, ["config", "--json"]).exit_code == 0
        assert not any(logging.getLogger(f"{n}.conn").isEnabledFor(logging.ERROR)
                       for n in CLIENT_LOGGERS)
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def test_a_text_command_keeps_the_client_loggers():
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    assert CliRunner().invoke(main, ["config"]).exit_code == 0
    assert all(logging.getLogger(n).level == logging.NOTSET for n in ("httpx", "httpcore"))
