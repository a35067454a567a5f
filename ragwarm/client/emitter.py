"""`QueryEmitter`: one QueryEvent per answer to rag.queries, kept while Kafka is away."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from ragwarm.settings import KafkaSettings
from schemas import QueryEvent, encode
from schemas.topics import RAG_QUERIES

log = logging.getLogger(__name__)

# Query events are small (~1 KB): 10,000 of them cover minutes of traffic on a broker outage
# and bound what an outage can hold in memory.
MAX_BUFFERED = 10_000


class QueryEmitter:
    """Publishes QueryEvents to rag.queries keyed by tenant, never blocking the answer.

    `emit` only appends to a bounded buffer; a sender thread hands the events to the
    producer. While the broker is away, an event the producer refuses, or one whose delivery
    fails later, goes back to the buffer and is sent again when the broker returns, so an
    outage loses nothing until the buffer is full. Beyond `max_buffered` the oldest event is
    dropped and counted in `dropped`: the query log feeds warmup statistics, and the answers
    must not wait for it.
    """

    def __init__(self, producer: Any, topic: str, max_buffered: int = MAX_BUFFERED,
                 retry_s: float = 1.0) -> None:
        self.producer, self.topic = producer, topic
        self.max_buffered, self.retry_s = max_buffered, retry_s
        self.errors = 0  # sends or deliveries that failed (and were queued again)
        self.dropped = 0  # events lost beyond the bound
        self._buffer: deque[QueryEvent] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="query-events", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, kafka: KafkaSettings) -> QueryEmitter:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        from ragwarm.kafka.common import KafkaUnreachable

        try:
            producer = KafkaProducer(bootstrap_servers=kafka.servers.split(","), linger_ms=2,
                                     max_block_ms=5000, **kafka.producer_options())
        except KafkaError as exc:
            raise KafkaUnreachable(kafka.servers, exc) from None
        return cls(producer, kafka.topic(RAG_QUERIES))

    @property
    def buffered(self) -> int:
        """Events not yet handed to the producer."""
        return len(self._buffer)

    def emit(self, event: QueryEvent) -> None:
        """Queue one event for sending; returns at once."""
        self._put(event, front=False)

    def _put(self, event: QueryEvent, front: bool) -> None:
        with self._cond:
            if len(self._buffer) >= self.max_buffered:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("query event buffer full (%d): %d events dropped so far",
                                self.max_buffered, self.dropped)
                if front:
                    return  # the returning event is the oldest: it is the one dropped
                self._buffer.popleft()
            if front:
                self._buffer.appendleft(event)
            else:
                self._buffer.append(event)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._buffer and not self._closing:
                    self._cond.wait()
                if not self._buffer:
                    return
                event = self._buffer.popleft()
            if not self._send(event):
                with self._cond:  # back off; close() wakes this wait
                    self._cond.wait(self.retry_s)

    def _send(self, event: QueryEvent) -> bool:
        try:
            future = self.producer.send(self.topic, key=event.tenant.encode(),
                                        value=encode(event))
        except Exception as exc:  # noqa: BLE001 - any refusal (no metadata, buffer full)
            self._failed(event, exc)
            return False
        future.add_errback(self._failed, event)
        return True

    def _failed(self, event: QueryEvent, exc: BaseException) -> None:
        self.errors += 1
        if self.errors == 1 or self.errors % 100 == 0:
            log.warning("query event not sent to %s yet (%s): kept and retried", self.topic,
                        exc)
        self._put(event, front=True)

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is buffered (waiting up to `timeout_s`), then close the producer."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        self.producer.flush(timeout=timeout_s)
        if self._buffer:
            log.warning("%d query events not sent before close", len(self._buffer))
        self.producer.close(timeout=timeout_s)
