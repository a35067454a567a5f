"""Warmup commands signed by the streams app and verified by workers (issue 41, item 4), and
what a worker does with a command whose handling fails (item 12, the worker's part)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from schemas import DeadLetter, WarmupCommand, encode
from schemas.deadletter import Origin
from schemas.signing import (
    COMMAND_SIGNATURE_HEADER,
    command_authentic,
    command_signature,
    derive_commands_key,
    header,
)
from streams.shell.agents import KafkaOutbox
from streams.sim import run_sync
from workers.commands import CommandConsumer, is_transient, retry_delay

MASTER = "the-streams-apps-master"
KEY = derive_commands_key(MASTER.encode()).encode()


def prefill(worker_id: str | None = None, cid: str = "c1") -> WarmupCommand:
    return WarmupCommand(command_id=cid, op="prefill", worker_id=worker_id, token_ids=[1] * 8)


class Topic:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, **kw: Any) -> None:
        self.sent.append(kw)


class Topics:
    commands = Topic()


def published(cmd: WarmupCommand, secret: str | None) -> tuple[bytes, list]:
    """What the streams app's outbox puts on warmup.commands: (value, headers)."""
    topics = Topics()
    topics.commands = Topic()
    outbox = KafkaOutbox(topics, 4, SecretStr(secret) if secret else None)  # type: ignore[arg-type]
    run_sync(outbox.command(cmd))
    (sent,) = topics.commands.sent
    return sent["value"], list(sent.get("headers") or [])


class Worker:
    """A command consumer's decisions, without a broker: handled, letters, refusals."""

    def __init__(self, key: bytes | None, handle=None, worker_id: str = "w1") -> None:
        self.handled: list[WarmupCommand] = []
        self.letters: list[DeadLetter] = []
        self.refused: list[tuple[str, str, str | None]] = []
        self.retries = 0

        def retried(_c: WarmupCommand, _e: BaseException) -> None:
            self.retries += 1

        self.consumer = CommandConsumer(
            "x:1", {}, worker_id, handle or self.handled.append,
            on_dead_letter=lambda x, _k: self.letters.append(x),
            commands_key=key,
            on_refused=lambda why, reason, cid: self.refused.append((why, reason, cid)),
            on_retry=retried,
        )

    def receive(self, value: bytes, headers: list, offset: int = 7) -> bool:
        origin = Origin("warmup.commands", 0, offset, b"k", value)
        return self.consumer._dispatch_safely(origin, headers)


def test_a_command_the_app_signed_is_carried_out() -> None:
    value, headers = published(prefill(), MASTER)
    assert header(headers, COMMAND_SIGNATURE_HEADER) is not None
    worker = Worker(KEY)
    assert worker.receive(value, headers)
    assert [c.command_id for c in worker.handled] == ["c1"]
    assert worker.letters == [] and worker.refused == []


def test_an_unsigned_command_is_refused_counted_and_dead_lettered() -> None:
    worker = Worker(KEY)
    assert worker.receive(encode(prefill()), [])
    assert worker.handled == []
    assert [(why, cid) for why, _, cid in worker.refused] == [("unsigned", "c1")]
    (letter,) = worker.letters
    assert "unsigned" in letter.reason and (letter.partition, letter.offset) == (0, 7)


def test_a_badly_signed_or_altered_command_is_refused() -> None:
    value, headers = published(prefill(), MASTER)
    worker = Worker(KEY)
    worker.receive(value.replace(b'"c1"', b'"c2"'), headers)  # changed after signing
    _, others = published(prefill(), "another-master")
    worker.receive(value, others)  # signed with another key
    worker.receive(value, [(COMMAND_SIGNATURE_HEADER, "not bytes")])
    assert worker.handled == []
    assert [why for why, _, _ in worker.refused] == ["bad_signature", "bad_signature", "unsigned"]
    assert len(worker.letters) == 3


def test_a_forgery_addressed_to_another_worker_is_that_workers_to_refuse() -> None:
    worker = Worker(KEY)
    worker.receive(encode(prefill(worker_id="w2")), [])
    assert worker.handled == worker.letters == worker.refused == []


def test_without_a_key_commands_are_taken_unsigned_as_before() -> None:
    value, headers = published(prefill(), None)
    assert headers == []
    worker = Worker(None)
    worker.receive(value, headers)
    assert len(worker.handled) == 1


@given(value=st.binary(max_size=300), sig=st.binary(max_size=80))
def test_no_other_signature_passes(value: bytes, sig: bytes) -> None:
    good = command_signature(value, KEY)
    assert command_authentic(value, good, KEY)
    assert command_authentic(value, sig, KEY) == (sig == good)
    assert not command_authentic(value + b" ", good, KEY)


# --- item 12: a command whose handling fails ------------------------------------------------


def test_a_transient_failure_is_retried_not_skipped() -> None:
    calls: list[str] = []

    def flaky(cmd: WarmupCommand) -> None:
        calls.append(cmd.command_id)
        if len(calls) < 3:
            raise RuntimeError("CUDA out of memory")

    worker = Worker(None, flaky)
    value = encode(prefill())
    assert worker.receive(value, []) is False  # to be tried again from its offset
    assert worker.receive(value, []) is False
    assert worker.receive(value, []) is True
    assert calls == ["c1"] * 3 and worker.retries == 2
    assert worker.letters == [] and worker.refused == []  # never a dead letter


def test_a_command_that_fails_for_its_own_content_is_dead_lettered_with_a_reason() -> None:
    def broken(_cmd: WarmupCommand) -> None:
        raise IndexError("index 50000 is out of bounds for dimension 0 with size 49152")

    worker = Worker(None, broken)
    assert worker.receive(encode(prefill()), []) is True  # the consumer moves on
    (letter,) = worker.letters
    assert letter.reason.startswith("command failed: IndexError: index 50000")
    assert [why for why, _, _ in worker.refused] == ["failed"] and worker.retries == 0


@pytest.mark.parametrize(
    ("exc", "transient"),
    [(RuntimeError("oom"), True), (OSError("disk"), True), (TimeoutError(), True),
     (ValueError("x"), False), (KeyError("x"), False), (AssertionError(), False)],
)  # fmt: skip
def test_which_failures_are_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


@given(st.integers(1, 10_000))
def test_the_retry_wait_grows_and_is_capped(n: int) -> None:
    assert 0.5 <= retry_delay(n) <= 30.0
    assert retry_delay(n + 1) >= retry_delay(n)
