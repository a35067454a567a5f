"""Changelog-backed tables of the streams app, each keyed like the topic that writes it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import faust

# The changelog partition a batch names for its writes (None: Faust's choice).
_WRITE_PARTITION: ContextVar[int | None] = ContextVar("ragwarm_write_partition", default=None)


class RoutedTable(faust.Table):
    """A table whose writes may name their changelog partition.

    Faust sends a write to the partition of the event being processed, which is the only
    right one for a record handled alone. A batch handles its records after the stream has
    moved past them, and a timer handles none: `writing_to` names the partition for the
    writes inside it, and a table made with `route` (table key -> partition) finds it from
    the key when nothing is named. Both go through `partition_for_key`, Faust's public hook.
    """

    def __init__(self, *args: Any, route: Callable[[Any], int] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.route = route

    def partition_for_key(self, key: Any) -> int | None:
        named = _WRITE_PARTITION.get()
        if named is not None:
            return named
        if self.route is not None:
            return self.route(key)
        return super().partition_for_key(key)


@contextlib.contextmanager
def writing_to(partition: int) -> Iterator[None]:
    """Table writes inside go to changelog `partition` (the partition of their record)."""
    token = _WRITE_PARTITION.set(partition)
    try:
        yield
    finally:
        _WRITE_PARTITION.reset(token)


@dataclass
class Tables:
    docs: faust.Table  # doc_key -> DocState (written on kb.changes, same key)
    doc_prefixes: faust.Table  # doc_key -> {prefix hash: [chunk refs]} (ragwarm.doc-links)
    prefixes: faust.Table  # prefix hash -> PrefixState (ragwarm.prefix-ops)
    workers: faust.GlobalTable  # worker id -> WorkerState (worker.events; read everywhere)
    # tenant U+001F slot -> the step's sketches; tenant U+001F "hot" -> the hot set
    # (rag.queries, keyed by tenant: see streams.decide.hot.HotTracker)
    hot_windows: faust.Table


def define_tables(
    app: faust.App, partitions: int, tenant_partition: Callable[[str], int]
) -> Tables:
    """`tenant_partition`: the rag.queries partition of a tenant (its producer's choice)."""
    from streams.decide.hot import tenant_of

    def table(name: str, cls: Callable[..., Any] = app.Table, **kw: Any) -> Any:
        # Keys and values go through the app's default JSON codec (never pickle).
        return cls(name, default=None, partitions=partitions, key_type=str, **kw)

    def routed(name: str, **kw: Any) -> RoutedTable:
        made = RoutedTable(app, name=name, beacon=app.tables.beacon, default=None,
                           partitions=partitions, key_type=str, **kw)
        app.tables.add(made)  # returns it, typed as any collection
        return made

    return Tables(
        docs=routed("docs"),
        doc_prefixes=table("doc_prefixes"),
        # Written one op at a time, in batches (`writing_to` names the op's partition).
        prefixes=routed("prefixes"),
        # Placement reads every worker while handling any prefix, so each process
        # keeps the whole (small) worker table. With several instances, only the one owning
        # a worker's worker.events partition writes its row; the others must go on reading
        # the changelog after recovery. Faust resumes those partitions only for a global
        # table with a recovery buffer of 1 (faust-streaming#283: without it a second
        # instance never saw a worker and answered no_worker to every prefill).
        workers=table("workers", cls=app.GlobalTable, recovery_buffer_size=1),
        # Written by the query batches and the hot-set timer: routed by the row's tenant.
        hot_windows=routed("hot_windows", route=lambda key: tenant_partition(tenant_of(key))),
    )
