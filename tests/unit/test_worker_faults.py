"""Worker side of issue 12: boot epochs, expired commands, heartbeats that do not wait for
generation, and a broker that is not there yet at start-up."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import pytest
from kafka.errors import KafkaTimeoutError

from schemas import WarmupCommand, encode
from tests.unit.worker_fakes import GatedLifecycle, serve, wait_ready
from workers.commands import BrokerUnavailable, CommandConsumer, connect_with_retry
from workers.service import STATE

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _consumer(handled: list, expired: list) -> CommandConsumer:
    return CommandConsumer(
        "127.0.0.1:1", {}, "w1", handled.append, on_expired=expired.append, clock=lambda: NOW
    )


def _cmd(expires_at: datetime | None) -> bytes:
    return encode(
        WarmupCommand(
            command_id="c", op="prefill", worker_id="w1", token_ids=[1], expires_at=expires_at
        )
    )


def test_expired_commands_are_skipped_and_reported():
    handled, expired = [], []
    consumer = _consumer(handled, expired)
    consumer._dispatch(_cmd(NOW - timedelta(seconds=1)))
    consumer._dispatch(_cmd(NOW + timedelta(seconds=60)))
    consumer._dispatch(_cmd(None))  # a v1 command: no expiry
    assert [c.command_id for c in expired] == ["c"]
    assert len(handled) == 2


def test_the_broker_is_retried_until_it_answers():
    tries, slept = [], []

    def connect():
        tries.append(1)
        if len(tries) < 3:
            raise KafkaTimeoutError("Unable to bootstrap")
        return "connected"

    assert connect_with_retry(connect, "test", 60, slept.append, lambda: 0.0) == "connected"
    assert slept == [0.5, 1.0]


def test_a_broker_that_never_answers_gives_one_clear_error():
    t = [0.0]

    def sleep(s):
        t[0] += s

    def connect():
        raise KafkaTimeoutError("Unable to bootstrap")

    with pytest.raises(BrokerUnavailable, match="broker unavailable after 20 s"):
        connect_with_retry(connect, "test", 20, sleep, lambda: t[0])
    assert t[0] <= 20


async def test_epochs_grow_with_each_boot_and_tag_every_event():
    lifecycle = GatedLifecycle()
    lifecycle.gate.set()
    first = lifecycle.start(lambda _r: None)
    second = lifecycle.start(lambda _r: None)
    assert second.epoch > first.epoch
    assert first.status_event("ready").epoch == first.epoch


async def test_heartbeats_go_on_while_every_engine_thread_is_busy():
    lifecycle = GatedLifecycle()
    lifecycle.gate.set()
    client = await serve(lifecycle)
    try:
        await wait_ready(client)
        service = client.app[STATE]
        release = threading.Event()
        loop = asyncio.get_running_loop()
        blocked = [loop.run_in_executor(service.executor, release.wait, 10) for _ in range(4)]
        before = lifecycle.sink.kinds().count("heartbeat")
        await asyncio.sleep(0.4)
        after = lifecycle.sink.kinds().count("heartbeat")
        release.set()
        await asyncio.gather(*blocked)
        assert after > before
    finally:
        await client.close()


class _FailingConsumer:
    """A kafka-python consumer's surface as `CommandConsumer` uses it: one batch, then (if
    `fails`) an error from poll, as a consumer fenced after a broker restart raises."""

    def __init__(self, record: bytes, fails: bool) -> None:
        from types import SimpleNamespace

        self.batch = {"tp": [SimpleNamespace(topic="warmup.commands", partition=0, offset=0,
                                             key=None, value=record, headers=[])]}
        self.fails, self.closed = fails, False

    def poll(self, timeout_ms: int) -> dict:
        if self.batch:
            batch, self.batch = self.batch, {}
            return batch
        if self.fails:
            raise RuntimeError("fenced")
        return {}

    def assignment(self) -> set:
        return {"tp"}

    def position(self, tp: object) -> int:
        return 1

    def commit(self) -> None: ...

    def end_offsets(self, parts: list) -> dict:
        return {p: 1 for p in parts}

    def close(self) -> None:
        self.closed = True


def test_a_consumer_failing_after_start_is_replaced_and_commands_keep_coming(monkeypatch):
    import workers.commands as commands

    monkeypatch.setattr(commands, "RECONNECT_S", 0.01)
    handled: list = []
    consumer = _consumer(handled, [])
    made = [_FailingConsumer(_cmd(None), fails=True), _FailingConsumer(_cmd(None), fails=False)]
    opened: list[_FailingConsumer] = []

    def connect() -> _FailingConsumer:
        opened.append(made[len(opened)] if len(opened) < len(made) else made[-1])
        return opened[-1]

    consumer._connect = connect  # type: ignore[method-assign]
    consumer.start(timeout_s=5)
    deadline = threading.Event()
    for _ in range(200):
        if len(handled) == 2:
            break
        deadline.wait(0.01)
    consumer.stop()
    assert len(handled) == 2  # the command after the failure reached the worker
    assert consumer.reconnects == 1 and made[0].closed
