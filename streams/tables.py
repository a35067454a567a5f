"""Changelog-backed tables of the streams app, each keyed like the topic that writes it."""

from __future__ import annotations

from dataclasses import dataclass

import faust


@dataclass
class Tables:
    docs: faust.Table  # doc_key -> DocState (written on kb.changes, same key)
    doc_prefixes: faust.Table  # doc_key -> {prefix hash: [chunk refs]} (ragwarm.doc-links)
    prefixes: faust.Table  # prefix hash -> PrefixState (ragwarm.prefix-ops)
    workers: faust.GlobalTable  # worker id -> WorkerState (worker.events; read everywhere)


def define_tables(app: faust.App, partitions: int) -> Tables:
    def table(name: str, cls=app.Table) -> faust.Table:
        # Keys and values go through the app's default JSON codec (never pickle).
        return cls(name, default=None, partitions=partitions, key_type=str)

    return Tables(
        docs=table("docs"),
        doc_prefixes=table("doc_prefixes"),
        prefixes=table("prefixes"),
        # Placement reads every worker while handling any prefix, so each process
        # keeps the whole (small) worker table.
        workers=table("workers", cls=app.GlobalTable),
    )
