"""Index recovery: after the tables are rebuilt, bring the local index up to them.

The tables come back from their changelogs on any host; the local Qdrant index lives on
one host's disk. A streams app started on a fresh disk (a pod moved) would otherwise hold
tables that say version N over an empty index: retrieval finds nothing and every warm op
is skipped as stale. So before it reports ready, the app re-indexes from `kb.changes`
(compacted: the latest version of every document stays) what its index lacks or holds at
an older version, while KB changes wait (`Readiness.index`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from schemas import KbChange, SchemaError, decode
from schemas.topics import split_kb_key
from streams.decide.records import DocState
from streams.handle.handlers import HandlerDeps, publish_indexed
from streams.shell.faults import Backoff, retry_until_done

log = logging.getLogger(__name__)

DocKey = tuple[str, str]  # (tenant, doc_id)
ReadChanges = Callable[[set[DocKey]], Iterable[KbChange]]


def plan_reindex(
    docs: Mapping[str, DocState], indexed: Mapping[DocKey, int | None]
) -> dict[DocKey, int]:
    """The documents to re-index and the version the docs table holds for each: those the
    index lacks (a deleted one it lacks is already right) or holds at an older version."""
    need = {}
    for table_key, state in docs.items():
        # The state names its tenant; the key may be one written before tenants were in it.
        key = (state.tenant, split_kb_key(table_key)[1])
        have = indexed.get(key)  # None: never indexed, or its first write cut short
        if (not state.deleted if have is None else have < state.version):
            need[key] = state.version
    return need


def pick_changes(changes: Iterable[KbChange], need: Mapping[DocKey, int]) -> dict[DocKey, KbChange]:
    """Per document, the change to re-index: the newest at or below the table's version (the
    KB-change agent then applies later ones as usual), else the oldest above it (compaction
    may have removed the exact one; the store takes an equal version again later)."""
    best: dict[DocKey, KbChange] = {}
    for change in changes:
        key = (change.tenant, change.doc_id)
        if key in need and _better(change, best.get(key), need[key]):
            best[key] = change
    return best


def _better(change: KbChange, current: KbChange | None, target: int) -> bool:
    if current is None:
        return True
    if change.version <= target:
        return current.version > target or change.version > current.version
    return current.version > target and change.version < current.version


async def recover_index(p: HandlerDeps, read: ReadChanges) -> int:
    """Re-index what the index lacks; returns how many documents were re-indexed.

    A replica first applies rag.chunks to its end (a fresh disk rebuilds from it without
    embedding); only what no instance ever published is re-indexed from kb.changes.
    """
    if p.replica is not None:
        p.readiness.reason = "replicating the index from rag.chunks"
        while not await p.replica.caught_up():
            log.info("index recovery: the replica is still catching up on rag.chunks")
    docs = dict(p.tables.doc_states.items())
    indexed = await p.blocking(p.rag.indexed_versions)
    need = plan_reindex(docs, indexed)
    if not need:
        return 0
    log.info("index recovery: %d documents missing or behind the docs table", len(need))
    p.readiness.reason = f"re-indexing {len(need)} documents from kb.changes"
    loop = asyncio.get_running_loop()
    changes = await loop.run_in_executor(None, lambda: list(read(set(need))))
    chosen = pick_changes(changes, need)
    for change in chosen.values():
        await p.blocking(p.rag.index, change)
        await publish_indexed(p)
    lost = sorted(set(need) - set(chosen))
    if lost:
        p.stats["index_unrecoverable"] += len(lost)
        log.error("index recovery: %d documents not in kb.changes: %s", len(lost), lost[:10])
    p.stats["index_recovered"] += len(chosen)
    return len(chosen)


async def recover_until_done(p: HandlerDeps, read: ReadChanges, backoff: Backoff) -> None:
    """Run the recovery until it succeeds (the store or broker may be down for a while),
    then open KB changes and the ready probe."""

    def failed(exc: Exception, delay: float) -> None:  # transient until shown otherwise
        log.exception("index recovery failed; retrying in %.1f s", delay)
        p.readiness.reason = f"index recovery failed ({type(exc).__name__}), retrying"

    count = await retry_until_done(lambda: recover_index(p, read), backoff, failed)
    log.info("index recovery done: %d documents re-indexed", count)
    p.readiness.recovered()


def register_recovery(app: Any, p: HandlerDeps, read: ReadChanges) -> None:
    """Hold KB changes and readiness until the index matches the recovered tables. Faust
    starts app tasks once table recovery is complete, so the task sees the whole tables."""
    p.readiness.wait_for_recovery()
    s = p.settings
    backoff = Backoff(s.retry_initial_s, s.retry_max_s, s.retry_attempts)

    async def recover_local_index() -> None:
        if s.recover_index:
            p.readiness.reason = "checking the index against the docs table"
            await recover_until_done(p, read, backoff)
        else:
            p.readiness.recovered()

    app.task(recover_local_index)


class KbChangesReader:
    """Reads `kb.changes` from the beginning to its current end (kafka-python, no group)."""

    def __init__(self, bootstrap: str, options: dict[str, Any], topic: str) -> None:
        self.bootstrap, self.options, self.topic = bootstrap, options, topic

    def __call__(self, wanted: set[DocKey]) -> Iterator[KbChange]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, **self.options)
        try:
            parts = [TopicPartition(self.topic, n) for n in consumer.partitions_for_topic(
                self.topic) or ()]
            consumer.assign(parts)
            consumer.seek_to_beginning(*parts)
            end = consumer.end_offsets(parts)
            while any(consumer.position(tp) < end[tp] for tp in parts):
                for records in consumer.poll(timeout_ms=1000).values():
                    yield from _wanted(records, wanted)
        finally:
            consumer.close()


def _wanted(records: Iterable[Any], wanted: set[DocKey]) -> Iterator[KbChange]:
    for record in records:
        try:
            change = decode(record.value, KbChange)
        except SchemaError:
            continue  # dead-lettered when it was first read
        assert isinstance(change, KbChange)
        if (change.tenant, change.doc_id) in wanted:
            yield change
