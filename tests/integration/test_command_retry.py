"""A worker's command that fails on the real broker (issue 41, item 12): a transient failure
is retried from its offset and its offset is never committed past it, so a restarted worker
tries it again; a command that fails for its own content is dead-lettered with the reason;
the consumer keeps going with the commands after both."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from kafka import KafkaProducer

from ragwarm.settings import KafkaSettings
from schemas import ChunkRef, DeadLetter, WarmupCommand, encode
from tests.integration.kafka_read import committed_offsets
from tests.integration.waiting import wait_for
from workers.commands import CommandConsumer

pytestmark = pytest.mark.integration


def _command(cid: str, worker_id: str) -> WarmupCommand:
    ref = ChunkRef(chunk_id="d.md#0", content_hash="0" * 64)
    return WarmupCommand(command_id=cid, op="invalidate", worker_id=worker_id, chunk_refs=[ref])


def test_a_failing_command_is_retried_or_dead_lettered_never_skipped(
    kafka_bootstrap: str, kafka_producer: KafkaProducer, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("commands", partitions=1)
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    options = KafkaSettings().client_options()
    failures = {"c-flaky": 3, "c-stuck": 10**9}
    handled: list[str] = []
    letters: list[DeadLetter] = []

    def handle(cmd: WarmupCommand) -> None:
        if failures.get(cmd.command_id, 0) > 0:
            failures[cmd.command_id] -= 1
            raise RuntimeError("CUDA error: out of memory")  # the device, not the command
        if cmd.command_id == "c-bad":
            raise IndexError("index 90000 is out of bounds for dimension 0 with size 49152")
        handled.append(cmd.command_id)

    def consumer(on_command: Callable[[WarmupCommand], None]) -> CommandConsumer:
        return CommandConsumer(kafka_bootstrap, options, worker_id, on_command, topic=topic,
                               on_dead_letter=lambda x, _k: letters.append(x),
                               retry_initial_s=0.2, retry_max_s=0.5)  # fmt: skip

    first = consumer(handle)
    first.start()
    try:
        for cid in ("c-flaky", "c-bad", "c-after"):
            kafka_producer.send(topic, value=encode(_command(cid, worker_id)))
        kafka_producer.flush()
        wait_for(lambda: handled == ["c-flaky", "c-after"], 60, "the flaky command, then the next")
        assert failures["c-flaky"] == 0  # tried 4 times, carried out once
        (letter,) = letters
        assert letter.offset == 1 and letter.reason.startswith("command failed: IndexError")

        # A command that keeps failing holds its partition: its offset is not committed.
        kafka_producer.send(topic, value=encode(_command("c-stuck", worker_id)))
        kafka_producer.send(topic, value=encode(_command("c-later", worker_id)))
        kafka_producer.flush()
        time.sleep(4)  # several retries and auto-commit runs (every second)
        assert handled == ["c-flaky", "c-after"]
    finally:
        first.stop()
    assert committed_offsets(kafka_bootstrap, first.group_id) == {0: 3}  # c-stuck's own offset

    # Restarted with the device back: it resumes at the stuck command, then the next.
    again: list[str] = []
    second = consumer(lambda cmd: again.append(cmd.command_id))
    second.start()
    try:
        wait_for(lambda: again == ["c-stuck", "c-later"], 60, "the stuck command retried")
    finally:
        second.stop()
    assert len(letters) == 1
