"""A worker's command consumer on the real broker: what a restart resumes from."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaProducer

from ragwarm.settings import KafkaSettings
from schemas import ChunkRef, WarmupCommand, encode
from tests.integration.kafka_read import committed_offsets, wait_group_empty
from workers.commands import CommandConsumer

pytestmark = pytest.mark.integration


def _start_and_hang(consumer: CommandConsumer, started: Any) -> None:
    consumer.start()
    started.set()
    time.sleep(600)


def _killed_after_start(consumer: CommandConsumer) -> None:
    """Start `consumer` in a child process and SIGKILL it once started (no close)."""
    started = multiprocessing.get_context("fork").Event()
    child = multiprocessing.get_context("fork").Process(
        target=_start_and_hang, args=(consumer, started), daemon=True
    )
    child.start()
    assert started.wait(120), "the first consumer never started"
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(30)


def test_a_worker_killed_right_after_start_resumes_where_it_started(
    kafka_bootstrap: str, kafka_producer: KafkaProducer, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("commands", partitions=4)
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    options = KafkaSettings().client_options()
    first = CommandConsumer(kafka_bootstrap, options, worker_id, lambda _c: None, topic=topic)
    # Killed as soon as it started, as SIGKILL does (no close, whose commit would hide it),
    # and before auto-commit's first run: only the start's own commit is there.
    _killed_after_start(first)
    wait_group_empty(kafka_bootstrap, first.group_id)

    # Committed at the positions resolved at start (the end: a new group), every partition.
    assert committed_offsets(kafka_bootstrap, first.group_id) == {0: 0, 1: 0, 2: 0, 3: 0}
    # Sent while the worker is down: the restarted one must handle it, not start past it.
    command = WarmupCommand(command_id="c-missed", op="invalidate", worker_id=worker_id,
                            chunk_refs=[ChunkRef(chunk_id="d.md#0", content_hash="0" * 64)])
    kafka_producer.send(topic, key=b"0" * 32, value=encode(command))
    kafka_producer.flush()

    handled: list[WarmupCommand] = []
    second = CommandConsumer(kafka_bootstrap, options, worker_id, handled.append, topic=topic)
    second.start()
    try:
        assert second.wait_caught_up(60)
        deadline = time.monotonic() + 30
        while not handled and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [c.command_id for c in handled] == ["c-missed"]
    finally:
        second.stop()


def test_a_worker_restarted_at_once_takes_its_place_without_waiting_out_its_session(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("commands", partitions=2)
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    # A session longer than the restart may wait: a dynamic member joining the group would
    # wait for the killed one's session to end before anything is assigned to it.
    options = KafkaSettings().client_options() | {"session_timeout_ms": 240_000}
    first = CommandConsumer(kafka_bootstrap, options, worker_id, lambda _c: None, topic=topic)
    _killed_after_start(first)

    second = CommandConsumer(kafka_bootstrap, options, worker_id, lambda _c: None, topic=topic,
                             connect_wait_s=10)
    try:
        second.start(timeout_s=90)  # raises TimeoutError when nothing was assigned by then
    finally:
        second.stop()
