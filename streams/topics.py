"""The topics the streams app reads and writes, external and internal."""

from __future__ import annotations

from dataclasses import dataclass

import faust

from schemas import topics as names

PREFIX_OPS = "ragwarm.prefix-ops"
DOC_LINKS = "ragwarm.doc-links"


@dataclass
class Topics:
    kb_changes: faust.TopicT
    queries: faust.TopicT
    commands: faust.TopicT
    worker_events: faust.TopicT
    deadletter: faust.TopicT
    prefix_ops: faust.TopicT
    doc_links: faust.TopicT


def define_topics(app: faust.App, partitions: int) -> Topics:
    def raw(name: str, **kw) -> faust.TopicT:
        return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                         value_serializer="raw", **kw)

    spec = names.TOPICS
    return Topics(
        kb_changes=raw(names.KB_CHANGES, partitions=spec[names.KB_CHANGES].partitions),
        queries=raw(names.RAG_QUERIES, partitions=spec[names.RAG_QUERIES].partitions),
        commands=raw(names.WARMUP_COMMANDS, partitions=spec[names.WARMUP_COMMANDS].partitions),
        worker_events=raw(names.WORKER_EVENTS, partitions=spec[names.WORKER_EVENTS].partitions),
        deadletter=raw(names.DEADLETTER, partitions=spec[names.DEADLETTER].partitions),
        # Internal topics are keyed by the key of the table their consumer writes.
        prefix_ops=raw(PREFIX_OPS, partitions=partitions, internal=True),
        doc_links=raw(DOC_LINKS, partitions=partitions, internal=True),
    )
