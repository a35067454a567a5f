"""`KbProducer`: the library KB ingestion systems use to publish `KbChange` records to Kafka."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

from kafka import KafkaProducer
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from kafka.producer.future import FutureRecordMetadata

from ragwarm.kafka.common import KafkaUnreachable, epoch_ms
from schemas import KbChange, encode
from schemas.topics import KB_CHANGES, kb_key


@dataclass(frozen=True)
class DeliveryFailure:
    """A change the broker did not acknowledge."""

    doc_id: str
    version: int
    error: str


@dataclass(frozen=True)
class DeliveryReport:
    """What became of the changes sent since the previous flush."""

    delivered: int
    failed: tuple[DeliveryFailure, ...] = ()


@dataclass(frozen=True)
class _Pending:
    change: KbChange
    future: FutureRecordMetadata


class KbProducer:
    """Publishes `KbChange` records keyed by tenant + doc_id (`schemas.topics.kb_key`: one
    document stays in order, and compaction keeps its latest version), acks=all.

    The producer is idempotent, which keeps per-document order even when sends are retried.
    `send` may raise `KafkaError` at once (a record over the size limit); broker-side
    failures are returned by `flush`.
    """

    def __init__(
        self,
        bootstrap: str,
        client_options: Mapping[str, object],
        topic: str = KB_CHANGES,
        connect_timeout_s: float = 15.0,
        **producer_options: object,
    ) -> None:
        self.topic = topic
        self.bootstrap = bootstrap
        options: dict[str, object] = {
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 5,
            "bootstrap_timeout_ms": int(connect_timeout_s * 1000),
        }
        options.update(client_options)
        options.update(producer_options)
        # Idempotence needs acks=all; with fewer acks (RAGWARM_KAFKA_ACKS) it must be off.
        options["enable_idempotence"] = options["acks"] in ("all", -1)
        try:
            self._producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), **options)
        except (KafkaTimeoutError, KafkaConnectionError) as exc:
            raise KafkaUnreachable(bootstrap, exc) from None
        self._pending: list[_Pending] = []

    def send(self, change: KbChange) -> FutureRecordMetadata:
        """Queue one change; its record carries the change's timestamp."""
        future = self._producer.send(
            self.topic,
            key=kb_key(change.tenant, change.doc_id),
            value=encode(change),
            timestamp_ms=epoch_ms(change.timestamp),
        )
        self._pending.append(_Pending(change, future))
        return future

    def flush(self, timeout_s: float | None = None) -> DeliveryReport:
        """Wait for every queued change; report the ones delivered and the ones that failed."""
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaTimeoutError:
            pass  # what is still pending is reported below as not acknowledged
        pending, self._pending = self._pending, []
        failed = tuple(_failure(p) for p in pending if _failed(p.future))
        return DeliveryReport(delivered=len(pending) - len(failed), failed=failed)

    def close(self, timeout_s: float | None = None) -> None:
        self._producer.close(timeout=timeout_s)

    def __enter__(self) -> KbProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _failed(future: FutureRecordMetadata) -> bool:
    # A future still pending after flush (timeout) counts as not delivered.
    return not future.is_done or future.failed()


def _failure(pending: _Pending) -> DeliveryFailure:
    future = pending.future
    error: object = future.exception if future.is_done else "not acknowledged before timeout"
    if isinstance(error, KafkaError) and not str(error):
        error = type(error).__name__
    return DeliveryFailure(pending.change.doc_id, pending.change.version, str(error))
