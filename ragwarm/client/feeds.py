"""The topics the gateway reads itself: every partition of one topic in a thread of its own
(kafka-python, no consumer group: each gateway reads everything), handed on in batches.

The gateway is an asyncio server; a blocking consumer in a daemon thread keeps the event loop
free, and what it feeds (`WorkerView`, `ReplicaIndex`) takes a lock. The streams app
dead-letters malformed records of these topics; the gateway is a second reader, so it counts
and skips them rather than dead-lettering each a second time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ragwarm.client.view import WorkerView
from ragwarm.settings import KafkaSettings
from schemas import SchemaError, WorkerEvent, decode

log = logging.getLogger(__name__)

POLL_MS = 500
BATCH_RECORDS = 512
Apply = Callable[[Sequence[Any]], None]


class TopicFeed:
    """Follows one topic from `since_s` seconds back (None: from the beginning) and passes
    each batch of records to `apply`; `caught_up` is set once it has read up to the end
    offsets it found at start. While the broker is away it keeps trying, every `retry_s`."""

    def __init__(self, kafka: KafkaSettings, topic: str, apply: Apply,
                 since_s: float | None = None, retry_s: float = 2.0) -> None:
        self.kafka, self.topic, self.apply = kafka, topic, apply
        self.since_s, self.retry_s = since_s, retry_s
        self.caught_up = threading.Event()
        self.records = 0  # records handed on so far
        self.failures = 0  # batches `apply` failed on (logged, then skipped)
        self._next: dict[int, int] = {}  # partition -> offset to resume at after a reconnect
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"feed-{topic}", daemon=True)

    def start(self) -> TopicFeed:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception as exc:  # noqa: BLE001 - a broker away: try again, never die
                log.warning("reading %s failed (%s: %s); again in %.0f s", self.topic,
                            type(exc).__name__, exc, self.retry_s)
                self._stop.wait(self.retry_s)

    def _follow(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.kafka.servers.split(","),
                                 group_id=None, enable_auto_commit=False,
                                 **self.kafka.client_options())
        try:
            parts = consumer.partitions_for_topic(self.topic)
            if not parts:
                raise RuntimeError(f"the topic {self.topic} does not exist yet")
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            self._seek(consumer, tps)
            ends = consumer.end_offsets(tps)
            while not self._stop.is_set():
                batch = consumer.poll(timeout_ms=POLL_MS, max_records=BATCH_RECORDS)
                records = [r for tp in sorted(batch, key=lambda t: t.partition)
                           for r in batch[tp]]
                if records:
                    self._hand_on(records)
                    self._resume_from(records)
                if not self.caught_up.is_set() and all(
                        consumer.position(tp) >= ends[tp] for tp in tps):
                    self.caught_up.set()
                    log.info("%s: caught up (%d records)", self.topic, self.records)
        finally:
            consumer.close()

    def _seek(self, consumer: Any, tps: list[Any]) -> None:
        # A reconnect after an outage starts where this feed stopped, not `since_s` again.
        resume = [tp for tp in tps if tp.partition in self._next]
        for tp in resume:
            consumer.seek(tp, self._next[tp.partition])
        tps = [tp for tp in tps if tp.partition not in self._next]
        if not tps:
            return
        if self.since_s is None:
            consumer.seek_to_beginning(*tps)
            return
        since_ms = int((time.time() - self.since_s) * 1000)
        found = consumer.offsets_for_times({tp: since_ms for tp in tps})
        for tp in tps:
            at = found.get(tp)
            if at is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, at.offset)

    def _hand_on(self, records: Sequence[Any]) -> None:
        try:
            self.apply(records)
        except Exception:  # noqa: BLE001 - one bad batch must not stop the feed
            self.failures += 1
            log.exception("%s: a batch of %d records could not be applied", self.topic,
                          len(records))
        self.records += len(records)

    def _resume_from(self, records: Sequence[Any]) -> None:
        for r in records:
            self._next[r.partition] = max(self._next.get(r.partition, 0), r.offset + 1)


def worker_events_apply(view: WorkerView, clock: Callable[[], float] = time.time) -> Apply:
    """Fold records of worker.events into `view` at their own times (never in the future)."""

    def apply(records: Sequence[Any]) -> None:
        for record in records:
            try:
                event = decode(record.value, WorkerEvent)
            except SchemaError as exc:
                view.ignored["malformed"] += 1
                log.debug("a malformed worker event skipped: %s", exc)
                continue
            view.apply(event, min(record.timestamp / 1000, clock()))

    return apply
