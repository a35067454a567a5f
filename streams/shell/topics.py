"""The topics the streams app reads and writes, external and internal."""

from __future__ import annotations

from dataclasses import dataclass

import faust

from schemas import topics as names

PREFIX_OPS = "ragwarm.prefix-ops"
DOC_LINKS = "ragwarm.doc-links"
WORKER_READY = "ragwarm.worker-ready"


@dataclass
class Topics:
    kb_changes: faust.TopicT
    queries: faust.TopicT
    commands: faust.TopicT
    worker_events: faust.TopicT
    deadletter: faust.TopicT
    chunks: faust.TopicT  # rag.chunks: the index replicated (streams.shell.replica)
    prefix_ops: faust.TopicT
    doc_links: faust.TopicT
    worker_ready: faust.TopicT


def define_topics(app: faust.App, partitions: int, prefix: str = "") -> Topics:
    def raw(name: str, **kw) -> faust.TopicT:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            **kw,
        )

    def external(name: str) -> faust.TopicT:
        return raw(prefix + name, partitions=names.TOPICS[name].partitions)

    return Topics(
        kb_changes=external(names.KB_CHANGES),
        queries=external(names.RAG_QUERIES),
        commands=external(names.WARMUP_COMMANDS),
        worker_events=external(names.WORKER_EVENTS),
        deadletter=external(names.DEADLETTER),
        chunks=external(names.RAG_CHUNKS),
        # Internal topics are keyed by the key of the table their consumer writes.
        prefix_ops=raw(prefix + PREFIX_OPS, partitions=partitions, internal=True),
        doc_links=raw(prefix + DOC_LINKS, partitions=partitions, internal=True),
        # Co-partitioned with the prefixes table: partition k reaches the owner of its k.
        worker_ready=raw(prefix + WORKER_READY, partitions=partitions, internal=True),
    )
