"""Each instance's index replica: publish what this instance indexed on `rag.chunks`, apply
what every instance published, and wait for it on demand (read-your-writes across instances).

Why a plain consumer and not a Faust agent or GlobalTable: a Faust app has one consumer
group, so an agent reads only its share of the partitions; a GlobalTable reads them all but
keeps every value (each vector) in memory and, with the in-memory table store, re-reads its
topic at every start. The replica's truth is the Qdrant store on disk, so the offsets it has
applied are stored in it, after the records (re-applying is idempotent): a restart resumes
where it stopped, an empty RAGWARM_HOME starts at offset 0 and rebuilds without embedding.
Every partition is assigned (no group), so every instance reads everything.

With a Qdrant server (`RAGWARM_QDRANT_URL`) all instances share one index: nothing is
published or followed, and `caught_up` is always true.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from schemas import SchemaError, encode
from schemas import deadletter as letters
from schemas.chunks import RefusedRecords, ReplicaRecord, decode_record
from streams.handle import catchup
from streams.handle.handlers import HandlerDeps
from streams.handle.ports import ReplicaStore
from streams.shell import faults

log = logging.getLogger(__name__)

POLL_MS = 500
BATCH_RECORDS = 512


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2) on `key`."""
    from aiokafka.partitioner import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


Decoded = tuple[Any, ReplicaRecord]  # a message and its record


def decode_batch(
    messages: Iterable[Any],
) -> tuple[list[Decoded], list[tuple[Any, SchemaError]]]:
    """The valid records of `messages` in order (with their message), and the bad ones
    with their error."""
    good: list[Decoded] = []
    bad: list[tuple[Any, SchemaError]] = []
    for msg in messages:
        try:
            good.append((msg, decode_record(msg.key, msg.value, list(msg.headers or ()))))
        except SchemaError as exc:
            bad.append((msg, exc))
    return good, bad


def next_offsets(messages: Iterable[Any]) -> dict[int, int]:
    """partition -> the offset after the last of `messages` there."""
    out: dict[int, int] = {}
    for msg in messages:
        out[msg.partition] = max(out.get(msg.partition, 0), msg.offset + 1)
    return out


class ChunkReplica:
    """Publishes this instance's indexed chunks and keeps its local index in step with
    `rag.chunks` (`follow`: local mode; with a shared server it only counts embeddings)."""

    def __init__(
        self,
        p: HandlerDeps,
        store: ReplicaStore,
        topic: Any,  # the app's rag.chunks topic (sending)
        deadletter: Any,  # the app's dead-letter topic
        make_consumer: Callable[[], Any],  # an unstarted aiokafka consumer, no group
        follow: bool,
    ) -> None:
        self.p, self.store, self.topic, self.deadletter = p, store, topic, deadletter
        self.name = topic.get_topic_name()
        self.make_consumer, self.follow = make_consumer, follow
        self.partitions = topic.partitions or 1
        self.positions: dict[int, int] = {}
        self.caught_up_from: float | None = None  # when the last catch-up that ended began
        self._consumer: Any = None
        self._offsets: Any = None  # a second client, for end offsets only (`_catch_up`)
        self._moved = asyncio.Condition()
        s = p.settings
        self.backoff = faults.Backoff(s.retry_initial_s, s.retry_max_s, s.retry_attempts)
        self.max_value = letters.value_limit(s.producer_max_request_bytes, s.deadletter_max_bytes)

    # --- out ----------------------------------------------------------------------------------
    async def publish(self) -> None:
        records, embedded = await self.p.blocking(self.store.take_outgoing)
        self.p.stats["chunks_embedded"] += embedded
        if not records:
            return
        start = time.perf_counter()
        # Straight to the app's producer, not `Topic.send`: Faust's per-message path cost
        # ~0.7 ms a record here (3.5 s of the first 400 trace events' 4,878 records, with
        # the embedder idle meanwhile); the producer's own send, 0.05 ms.
        producer = await self.topic.app.maybe_start_producer()
        sent = [
            await producer.send(
                self.name, r.key, r.value, partition_for(r.partition_key, self.partitions),
                None, list(r.headers),
            )
            for r in records
        ]
        await asyncio.gather(*sent)  # acknowledged before the ops that depend on them go out
        self.p.stats["replica_published"] += len(records)
        # Part of `kb_index_ms`: the embedder waits meanwhile (bench pipeline: kb_publish_s).
        self.p.stats["replica_publish_ms"] += round((time.perf_counter() - start) * 1000)

    # --- in -----------------------------------------------------------------------------------
    async def caught_up(self, timeout_s: float | None = None, since: float | None = None) -> bool:
        """Apply rag.chunks up to its end offsets now; `since`: when the inputs being handled
        arrived (`streams.handle.catchup`), so that a catch-up begun after it is reused."""
        if not self.follow:
            return True
        if catchup.covers(self.caught_up_from, since):
            self.p.stats["replica_catchups_reused"] += 1
            return True
        began = time.monotonic()  # before the end offsets are asked: covers what came first
        wait = self.p.settings.replica_wait_s if timeout_s is None else timeout_s
        try:
            await asyncio.wait_for(self._catch_up(), wait)
        except TimeoutError:
            self.p.stats["replica_wait_timeouts"] += 1
            return False
        self.p.stats["replica_catchup_ms"] += round((time.monotonic() - began) * 1000)
        self.p.stats["replica_catchups"] += 1
        self.caught_up_from = max(began, self.caught_up_from or began)
        return True

    async def _catch_up(self) -> None:
        async with self._moved:
            await self._moved.wait_for(lambda: self._consumer is not None)
        consumer = self._consumer
        # Asked on a client of its own: on the follower's connection the request would wait
        # behind its long-polling fetch (a broker answers a connection's requests in order),
        # up to fetch_max_wait_ms (500 ms) per catch-up, i.e. per op batch and hot tick.
        end = await self._offsets.end_offsets(list(consumer.assignment()))
        target = {tp.partition: offset for tp, offset in end.items()}
        async with self._moved:
            await self._moved.wait_for(lambda: all(
                self.positions.get(n, 0) >= offset for n, offset in target.items()
            ))

    async def run(self) -> None:
        """Follow rag.chunks for good; a failure (broker, store) restarts it after a pause."""
        if not self.follow:
            return

        def failed(_exc: Exception, delay: float) -> None:  # transient until shown otherwise
            self.p.stats["replica_restarts"] += 1
            log.exception("index replica: following %s failed; again in %.1f s",
                          self.name, delay)

        await faults.retry_until_done(self._follow, self.backoff, failed)

    async def _follow(self) -> None:
        from aiokafka import TopicPartition

        consumer, offsets = self.make_consumer(), self.make_consumer()
        await consumer.start()
        try:
            await offsets.start()
            self._offsets = offsets
            # The partitions the publisher sends to (the topic's spec; ensure_topics made it).
            parts = [TopicPartition(self.name, n) for n in range(self.partitions)]
            consumer.assign(parts)
            stored = await self.p.blocking(self.store.replica_offsets, self.name)
            for tp in parts:
                if tp.partition in stored:
                    consumer.seek(tp, stored[tp.partition])
                else:
                    await consumer.seek_to_beginning(tp)
            await self._moved_to(consumer, parts)
            while True:
                batches = await consumer.getmany(timeout_ms=POLL_MS, max_records=BATCH_RECORDS)
                messages = [m for tp in sorted(batches, key=lambda t: t.partition)
                            for m in batches[tp]]
                if messages:
                    await self.apply(messages)
                await self._moved_to(consumer, parts)
        finally:
            self._consumer = None
            await consumer.stop()
            await offsets.stop()

    async def _moved_to(self, consumer: Any, parts: Sequence[Any]) -> None:
        positions = {tp.partition: await consumer.position(tp) for tp in parts}
        async with self._moved:
            self._consumer, self.positions = consumer, positions
            self._moved.notify_all()

    async def apply(self, messages: Sequence[Any]) -> None:
        """Apply one batch (dead-lettering bad records, and those the store refuses), then
        record the offsets after it; a transient failure of the store is retried until it
        takes the batch (a skipped one would be lost)."""
        good, bad = decode_batch(messages)
        for msg, exc in bad:
            await self._dead_letter(msg, exc)
        counts = await self._apply_decoded(good)
        offsets = {**self.positions, **next_offsets(messages)}
        await self.p.blocking(self.store.save_replica_offsets, self.name, offsets)
        for name, n in counts.items():
            self.p.stats[f"replica_{name}"] += n

    async def _apply_decoded(self, good: list[Decoded]) -> Mapping[str, int]:
        """Apply the decoded records: those the store refuses for good (a vector of another
        size) are dead-lettered and the rest applied; any other failure is retried until
        the store is back."""

        async def attempt() -> Mapping[str, int]:
            nonlocal good
            while True:
                try:
                    return await self.p.blocking(self.store.apply_replicated,
                                                 [r for _, r in good])
                except RefusedRecords as exc:  # valid records the store cannot hold
                    for i in sorted(exc.refused):
                        await self._dead_letter(good[i][0], exc.refused[i])
                    self.p.stats["replica_refused"] += len(exc.refused)
                    good = [g for i, g in enumerate(good) if i not in exc.refused]

        def failed(_exc: Exception, delay: float) -> None:  # the store may come back
            log.exception("index replica: applying a batch failed; again in %.1f s", delay)
            self.p.stats["retries"] += 1

        return await faults.retry_until_done(attempt, self.backoff, failed)

    async def _dead_letter(self, msg: Any, exc: SchemaError) -> None:
        origin = letters.Origin(msg.topic, msg.partition, msg.offset, msg.key, msg.value)
        reason, field = faults.reason_of(exc)
        letter = letters.dead_letter(origin, reason, field, self.max_value)
        # The offset is saved after this: a letter never sent would lose it.
        await faults.retry_until_done(
            lambda: self.deadletter.send(key=letters.letter_key(origin), value=encode(letter)),
            self.backoff,
            lambda _exc, delay: log.exception("could not send a dead letter; retrying in "
                                              "%.1f s", delay))
        self.p.stats["dead_letters"] += 1
        log.warning("dead letter from %s[%s]@%s: %s", msg.topic, msg.partition, msg.offset, reason)


def register_replica(app: Any, replica: ChunkReplica) -> None:
    """Follow rag.chunks from the worker's start, beside the agents."""

    async def follow_chunks() -> None:
        await replica.run()

    app.task(follow_chunks)
