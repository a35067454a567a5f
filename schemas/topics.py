"""Every Kafka topic ragwarm uses: name, key, partitions, and retention or compaction."""

from __future__ import annotations

from dataclasses import dataclass, field

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    key: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


KB_CHANGES = "kb.changes"
RAG_QUERIES = "rag.queries"
WARMUP_COMMANDS = "warmup.commands"
WORKER_EVENTS = "worker.events"
DEADLETTER = "ragwarm.deadletter"

TOPICS: dict[str, TopicSpec] = {
    t.name: t
    for t in (
        # Compacted, keyed by tenant + doc_id (`kb_key`): the latest version of every
        # document stays for good, so a streams app whose index disk is lost rebuilds the
        # index from it (a delete is a record, not a tombstone, so it stays too). Older
        # versions go once the log cleaner runs: replays see the latest state per doc.
        TopicSpec(KB_CHANGES, "tenant + doc_id", 4, {"cleanup.policy": "compact"}),
        TopicSpec(RAG_QUERIES, "tenant", 4, {"retention.ms": str(7 * DAY_MS)}),
        TopicSpec(WARMUP_COMMANDS, "prefix hash", 4, {"retention.ms": str(DAY_MS)}),
        TopicSpec(WORKER_EVENTS, "worker id", 4, {"retention.ms": str(DAY_MS)}),
        TopicSpec(DEADLETTER, "original key", 1, {"retention.ms": str(30 * DAY_MS)}),
    )
}


def kb_key(tenant: str, doc_id: str) -> bytes:
    """The `kb.changes` key of a document: its doc_id for the default tenant (the key of
    records written before tenants were part of it), else tenant, U+001F, doc_id."""
    return (doc_id if tenant == "default" else f"{tenant}\x1f{doc_id}").encode("utf-8")


def split_kb_key(key: str) -> tuple[str, str]:
    """(tenant, doc_id) of a `kb_key` read as text; a key without U+001F is the default's."""
    tenant, sep, doc_id = key.partition("\x1f")
    return (tenant, doc_id) if sep else ("default", key)


def prefixed(prefix: str) -> list[TopicSpec]:
    """The topic specs with every name prefixed (one namespace per test run or deployment)."""
    return [
        TopicSpec(prefix + t.name, t.key, t.partitions, dict(t.config)) for t in TOPICS.values()
    ]
