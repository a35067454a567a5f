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
        # Full history is kept: data teams replay it to rebuild state.
        TopicSpec(KB_CHANGES, "doc_id", 4, {"retention.ms": "-1"}),
        TopicSpec(RAG_QUERIES, "tenant", 4, {"retention.ms": str(7 * DAY_MS)}),
        TopicSpec(WARMUP_COMMANDS, "prefix hash", 4, {"retention.ms": str(DAY_MS)}),
        TopicSpec(WORKER_EVENTS, "worker id", 4, {"retention.ms": str(DAY_MS)}),
        TopicSpec(DEADLETTER, "original key", 1, {"retention.ms": str(30 * DAY_MS)}),
    )
}


def prefixed(prefix: str) -> list[TopicSpec]:
    """The topic specs with every name prefixed (one namespace per test run or deployment)."""
    return [
        TopicSpec(prefix + t.name, t.key, t.partitions, dict(t.config)) for t in TOPICS.values()
    ]
