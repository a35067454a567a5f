"""Kafka I/O of a worker: consume `warmup.commands`, publish `worker.events`, and dead-letter
the commands it cannot read (as the streams app does for its topics, `schemas.deadletter`)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from schemas import DeadLetter, SchemaError, WarmupCommand, WorkerEvent, decode, encode
from schemas.deadletter import Origin, dead_letter, letter_key, value_limit
from schemas.signing import COMMAND_SIGNATURE_HEADER, command_authentic, header, sign
from schemas.topics import DEADLETTER, WARMUP_COMMANDS, WORKER_EVENTS

log = logging.getLogger(__name__)

POLL_MS = 250
# A command whose handling failed for a transient reason is retried from its offset after
# this wait, doubling to the cap (issue 41: never skipped, its offset never committed).
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 30.0
# A failure of the command's own content: the same command fails the same way again.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, LookupError, AssertionError,
)
# After the consumer fails past start, the wait before a new one is connected.
RECONNECT_S = 2.0
# How long start-up retries a broker that does not answer (it may be starting too).
BROKER_WAIT_S = 300.0

T = TypeVar("T")


class BrokerUnavailable(RuntimeError):
    """The broker did not answer within the start-up wait (a clear line, not a traceback)."""


def connect_with_retry(
    connect: Callable[[], T],
    what: str,
    wait_s: float = BROKER_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`connect()` until it succeeds, waiting 0.5 s doubling to 10 s between tries; one log
    line when the broker is first found missing, `BrokerUnavailable` after `wait_s`."""
    from kafka.errors import KafkaError

    deadline, delay, warned = clock() + wait_s, 0.5, False
    while True:
        try:
            return connect()
        except (KafkaError, OSError) as exc:
            if clock() + delay > deadline:
                raise BrokerUnavailable(
                    f"{what}: broker unavailable after {wait_s:.0f} s: {exc}"
                ) from None
            if not warned:
                log.warning("%s: broker unavailable (%s); retrying for up to %.0f s",
                            what, exc, wait_s)
                warned = True
            sleep(delay)
            delay = min(10.0, delay * 2)


class EventSink(Protocol):
    """Where a worker's events go."""

    def send(self, event: WorkerEvent) -> None: ...

    def close(self) -> None: ...


class NullSink:
    """A worker without Kafka: events are only logged at debug level."""

    def send(self, event: WorkerEvent) -> None:
        log.debug("event %s %s", event.kind, event.prefix_hash or "")

    def close(self) -> None:
        return None


class KafkaEventSink:
    """Publishes `WorkerEvent`s on `worker.events`, keyed by worker id, and dead letters on
    `ragwarm.deadletter` (thread-safe)."""

    def __init__(
        self,
        bootstrap: str,
        client_options: dict[str, Any],
        worker_id: str,
        *,
        topic: str = WORKER_EVENTS,
        deadletter_topic: str = DEADLETTER,
        connect_wait_s: float = BROKER_WAIT_S,
        secret: bytes | None = None,
    ) -> None:
        from kafka import KafkaProducer

        # Options from the composition root (security, acks) win over these defaults.
        options = {"acks": 1, "linger_ms": 5, **client_options}
        self._producer = connect_with_retry(
            lambda: KafkaProducer(bootstrap_servers=bootstrap, **options),
            f"worker.events at {bootstrap}",
            connect_wait_s,
        )
        self._key = worker_id.encode()
        self._topic = topic
        self._deadletter_topic = deadletter_topic
        self._secret = secret

    def send(self, event: WorkerEvent) -> None:
        if self._secret:
            event = sign(event, self._secret)
        future = self._producer.send(self._topic, key=self._key, value=encode(event))
        future.add_errback(lambda exc: log.error("could not publish %s: %s", event.kind, exc))

    def dead_letter(self, letter: DeadLetter, key: bytes | None) -> None:
        """Send a dead letter; the producer retries it until its delivery timeout."""
        where = f"{letter.source_topic}[{letter.partition}]@{letter.offset}"
        future = self._producer.send(self._deadletter_topic, key=key, value=encode(letter))
        future.add_errback(lambda exc: log.error("could not dead-letter %s: %s", where, exc))

    def close(self) -> None:
        self._producer.flush(timeout=10)
        self._producer.close(timeout=10)


def parse_command(value: bytes | None, worker_id: str) -> WarmupCommand | None:
    """The command in a record if it is meant for `worker_id`; None when addressed elsewhere.

    Raises `SchemaError` for a record that is not a valid `WarmupCommand`.
    """
    if value is None:
        raise SchemaError("", "empty record (tombstone)")
    command = decode(value, WarmupCommand)
    assert isinstance(command, WarmupCommand)
    if command.worker_id is not None and command.worker_id != worker_id:
        return None
    return command


def is_transient(exc: BaseException) -> bool:
    """Whether a command that raised `exc` may succeed if tried again (memory, the device,
    the disk, a timeout): retried. Otherwise it is dead-lettered with the error as reason."""
    return not isinstance(exc, PERMANENT_ERRORS)


def retry_delay(failures: int, initial_s: float = RETRY_INITIAL_S,
                max_s: float = RETRY_MAX_S) -> float:
    """The wait before the `failures`-th retry of one command (1, 2, ...)."""
    return min(max_s, initial_s * 2 ** min(max(failures - 1, 0), 30))


def unauthenticated(value: bytes | None, headers: object, key: bytes | None) -> str | None:
    """Why a record may not be acted on under the commands key (`unsigned`,
    `bad_signature`); None when no key is configured or the signature holds."""
    if key is None:
        return None
    signature = header(headers, COMMAND_SIGNATURE_HEADER)
    if signature is None:
        return "unsigned"
    return None if command_authentic(value or b"", signature, key) else "bad_signature"


def addressing(value: bytes | None) -> tuple[str | None, str | None]:
    """Best effort on a record that failed validation: its (command_id, worker_id) strings."""
    try:
        obj = json.loads(value or b"")
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    cid, wid = obj.get("command_id"), obj.get("worker_id")
    return (
        cid[:1024] if isinstance(cid, str) and cid and _encodable(cid) else None,
        wid if isinstance(wid, str) else None,
    )


def _encodable(text: str) -> bool:
    """Whether `text` can be sent back in an event (JSON's "\\ud800" is no UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def command_group_id(worker_id: str, prefix: str = "") -> str:
    """The consumer group a worker reads `warmup.commands` in (one per worker: every worker
    reads every command); operators and `bench faults` read its lag by this name."""
    return f"{prefix}ragwarm-worker-{worker_id}"


class CommandConsumer:
    """A thread consuming `warmup.commands` in the group `[topic prefix]ragwarm-worker-<id>`.

    A new group starts at the end of the topic ("latest"): a new worker does not replay
    old commands; a restarted one resumes from its committed offsets. A record that is not
    a valid command, addressed to this worker or to none, is refused (`on_malformed`) and
    dead-lettered (`on_dead_letter`) with the decoder's reason; one addressed to another
    worker is that worker's to refuse. Every worker reads every command (a group each), so
    an unaddressed bad record gets one letter per worker, all naming the same origin. An
    error while handling a command never stops the loop.

    With a `commands_key`, a record without a valid signature header is refused before it
    is read (`on_refused("unsigned" | "bad_signature", ...)`) and dead-lettered, under the
    same addressing rule. A command whose handler raises is dead-lettered and refused
    (`"failed"`) when the error is the command's own (`is_transient`); otherwise the
    consumer seeks back to it and tries again after a growing wait (`on_retry`), so its
    offset is not committed and the commands after it on that partition wait their turn.
    """

    def __init__(
        self,
        bootstrap: str,
        client_options: dict[str, Any],
        worker_id: str,
        handle: Callable[[WarmupCommand], object],
        *,
        on_malformed: Callable[[str, str | None], None] = lambda _reason, _cid: None,
        on_dead_letter: Callable[[DeadLetter, bytes | None], None] | None = None,
        on_expired: Callable[[WarmupCommand], None] | None = None,
        topic: str = WARMUP_COMMANDS,
        group_prefix: str = "",
        connect_wait_s: float = BROKER_WAIT_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        commands_key: bytes | None = None,
        on_refused: Callable[[str, str, str | None], None] = lambda _why, _reason, _cid: None,
        on_retry: Callable[[WarmupCommand, BaseException], None] | None = None,
        retry_initial_s: float = RETRY_INITIAL_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self._bootstrap = bootstrap
        self._group_prefix = group_prefix
        self._options = client_options
        self._worker_id = worker_id
        self._handle = handle
        self._on_malformed = on_malformed
        self._on_dead_letter = on_dead_letter
        self._on_expired = on_expired or _log_expired
        self._connect_wait_s = connect_wait_s
        self._clock = clock
        self._commands_key = commands_key
        self._on_refused = on_refused
        self._on_retry = on_retry
        self._retry = (retry_initial_s, retry_max_s)
        self._failures = 0  # consecutive transient failures of the command being retried
        self.reconnects = 0  # consumers replaced after failing past start
        self._topic = topic
        self._stop = threading.Event()
        self._assigned = threading.Event()
        # Set once every command already in the topic at assignment has been handled.
        self._caught_up = threading.Event()
        self._ends: dict[Any, int] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="warmup-commands", daemon=True)

    @property
    def group_id(self) -> str:
        return command_group_id(self._worker_id, self._group_prefix)

    def start(self, timeout_s: float = 180.0) -> None:
        """Start consuming; returns once partitions are assigned and positioned (the broker
        is waited for first, up to `connect_wait_s`). A group join waits out the broker's
        rebalance delay and every member's session: on a busy host 60 s was seen to fail."""
        timeout_s += self._connect_wait_s
        self._thread.start()
        if not self._assigned.wait(timeout_s):
            raise TimeoutError(f"no partitions of {self._topic} assigned after {timeout_s:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"command consumer failed: {self._error}") from self._error

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        """Consume until stopped. A consumer that fails after start (seen once in `bench
        faults` after a broker restart: one worker's commands stopped, three invalidations
        never ran) is closed and replaced by a new one, which resumes from the committed
        offsets; the worker keeps serving meanwhile and never stops taking commands."""
        while not self._stop.is_set():
            try:
                consumer = self._connect()
            except BaseException as exc:
                if not self._assigned.is_set():  # at start: reported by start()
                    self._error = exc
                    self._assigned.set()
                    return
                log.warning("reconnecting to %s failed (%s: %s); again in %.0f s",
                            self._topic, type(exc).__name__, exc, RECONNECT_S)
                self._stop.wait(RECONNECT_S)
                continue
            try:
                self._consume(consumer)
            except Exception as exc:  # noqa: BLE001 - never let the command thread die
                self.reconnects += 1
                log.warning("the %s consumer failed (%s: %s); a new one resumes from the "
                            "committed offsets in %.0f s", self._topic, type(exc).__name__,
                            exc, RECONNECT_S)
                self._stop.wait(RECONNECT_S)
            finally:
                with contextlib.suppress(Exception):
                    consumer.close()

    def _consume(self, consumer: Any) -> None:
        while not self._stop.is_set():
            batches = consumer.poll(timeout_ms=POLL_MS)
            self._mark_assigned(consumer)
            retry = False
            for tp, records in batches.items():
                for r in records:
                    origin = Origin(r.topic, r.partition, r.offset, r.key, r.value)
                    if not self._dispatch_safely(origin, r.headers):
                        # Back to the failed command: the next poll fetches it again, and
                        # auto-commit commits this position, not one past it.
                        consumer.seek(tp, r.offset)
                        retry = True
                        break
            if retry:
                self._stop.wait(retry_delay(self._failures, *self._retry))
            self._mark_caught_up(consumer)

    def _connect(self) -> Any:
        return connect_with_retry(
            self._subscribed, f"{self._topic} at {self._bootstrap}", self._connect_wait_s
        )

    def _subscribed(self) -> Any:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self.group_id,
            # A static member: a worker restarted with its id takes its place at once. As a
            # dynamic one it waited out the killed process's session (45 s) before it was
            # assigned anything (issue 40). A second process with the same id fences the first.
            group_instance_id=self._worker_id,
            auto_offset_reset="latest",
            enable_auto_commit=True,
            auto_commit_interval_ms=1000,
            # A topic created after the subscription (a fresh cluster, the streams app
            # creating it) is only seen at the next metadata refresh: kafka-python's
            # default of 5 min left a worker unassigned past its start timeout.
            metadata_max_age_ms=5_000,
            **self._options,
        )
        consumer.subscribe([self._topic])
        try:
            # The subscribed topic's partitions known before the group join (the first
            # poll): joined without them, the consumer is assigned nothing, then joins again
            # when metadata arrives, and that second join was seen to hang for minutes.
            consumer.partitions_for_topic(self._topic)
        except BaseException:
            consumer.close()
            raise
        return consumer

    def _mark_assigned(self, consumer: Any) -> None:
        if self._assigned.is_set():
            return
        partitions = consumer.assignment()
        if partitions:
            # Resolving positions now fixes "latest" before we report ready, so a command
            # sent after `ready` is never skipped by a late offset reset.
            for tp in partitions:
                consumer.position(tp)
            self._commit_positions(consumer)
            log.info(
                "consuming %s as %s (%d partitions)", self._topic, self.group_id, len(partitions)
            )
            self._ends = dict(consumer.end_offsets(list(partitions)))
            self._assigned.set()

    def _commit_positions(self, consumer: Any) -> None:
        """Commit the positions just resolved, before `ready`. A new group has no committed
        offsets and starts at the end ("latest"); auto-commit first runs a second or more
        after the join, so a worker killed before it restarted at the end again and skipped
        every command sent while it was down (an invalidation among them). A failed commit
        is left to auto-commit."""
        try:
            consumer.commit()
        except Exception as exc:  # noqa: BLE001 - a rebalance under way; auto-commit follows
            log.warning("could not commit the starting positions of %s: %s", self._topic, exc)

    def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait until the commands sent before this consumer started (those a restarted
        worker missed while down) have been handled; False on timeout."""
        return self._caught_up.wait(timeout_s)

    def _mark_caught_up(self, consumer: Any) -> None:
        if self._caught_up.is_set() or not self._assigned.is_set():
            return
        if all(consumer.position(tp) >= end for tp, end in self._ends.items()):
            self._caught_up.set()

    def _dispatch_safely(self, origin: Origin, headers: object = ()) -> bool:
        """Dispatch one record; False when its command failed transiently (to be retried)."""
        try:
            return self._dispatch(origin.value, origin, headers)
        except Exception:  # noqa: BLE001 - one record must never stop the consumer thread
            log.exception("%s[%s]@%s: not handled; skipped",
                          origin.topic, origin.partition, origin.offset)  # fmt: skip
            return True

    def _dispatch(
        self, value: bytes | None, origin: Origin | None = None, headers: object = ()
    ) -> bool:
        """Refuse, dead-letter, skip or carry out one record; False when its command failed
        for a transient reason and must be tried again (nothing else is ever retried)."""
        origin = origin or Origin(self._topic, None, None, None, value)
        why = unauthenticated(value, headers, self._commands_key)
        if why is not None:
            command_id, worker_id = addressing(value)
            if worker_id in (None, self._worker_id):
                reason = f"{why.replace('_', ' ')} command: refused under the commands key"
                log.warning("refusing command %s at %s[%s]@%s: %s", command_id, origin.topic,
                            origin.partition, origin.offset, reason)  # fmt: skip
                self._dead_letter(origin, reason, None)
                self._on_refused(why, reason, command_id)
            return True
        try:
            command = parse_command(value, self._worker_id)
        except SchemaError as exc:
            command_id, worker_id = addressing(value)
            if worker_id in (None, self._worker_id):
                log.warning("refusing malformed command %s: %s", command_id, exc)
                self._dead_letter(origin, str(exc), exc.field)
                self._on_malformed(str(exc), command_id)
            return True
        if command is None:
            return True
        if command.expired(self._clock()):
            self._on_expired(command)
            return True
        return self._carry_out(command, origin)

    def _carry_out(self, command: WarmupCommand, origin: Origin) -> bool:
        try:
            self._handle(command)
        except Exception as exc:
            if is_transient(exc):
                self._failures += 1
                log.warning("command %s (%s) failed (%s: %s); retry %d in %.1f s",
                            command.command_id, command.op, type(exc).__name__, exc,
                            self._failures, retry_delay(self._failures, *self._retry))
                if self._on_retry is not None:
                    self._on_retry(command, exc)
                return False
            self._failures = 0
            reason = f"command failed: {type(exc).__name__}: {str(exc)[:1000]}"
            log.exception("command %s (%s) failed for good: dead-lettered",
                          command.command_id, command.op)
            self._dead_letter(origin, reason, None)
            self._on_refused("failed", reason, command.command_id)
            return True
        self._failures = 0
        return True

    def _dead_letter(self, origin: Origin, reason: str, field_name: str | None) -> None:
        if self._on_dead_letter is not None:
            # The size limits of the streams app's defaults: the worker's producer keeps
            # kafka-python's max request size, over the 1 MB these letters are cut to fit.
            letter = dead_letter(origin, reason, field_name, value_limit())
            self._on_dead_letter(letter, letter_key(origin))


def _log_expired(command: WarmupCommand) -> None:
    log.info("command %s expired at %s: skipped", command.command_id, command.expires_at)
