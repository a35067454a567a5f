"""Every Kafka topic ragwarm uses: name, key, partitions, and retention or compaction."""

from __future__ import annotations

import json
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
RAG_CHUNKS = "rag.chunks"

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
        # Compacted, keyed by chunk (`chunk_key`) or document (`indexed_doc_key`), each
        # record sent to its document's partition (`chunk_partition_key`), so a replica
        # reads a document's chunks before the record committing their version. The latest
        # record per key stays: a new instance rebuilds its index from it without
        # embedding; a removed chunk's tombstone deletes it from every replica.
        TopicSpec(RAG_CHUNKS, "tenant + chunk id (partitioned by document)", 4,
                  {"cleanup.policy": "compact"}),
    )
}


def kb_key(tenant: str, doc_id: str) -> bytes:
    """The `kb.changes` key of a document: its doc_id for the default tenant (the key of
    records written before tenants were part of it), else tenant, U+001F, doc_id.

    One key per document: a tenant id holds no U+001F (`schemas.events.TenantId`), so a
    key splits at its first one; a default-tenant doc id holding one takes the long form
    too, else ("default", "a\x1fb") and ("a", "b") shared the key "a\x1fb"."""
    if "\x1f" in tenant:
        raise ValueError("a tenant id may not hold U+001F (it separates tenant and doc id)")
    short = tenant == "default" and "\x1f" not in doc_id
    return (doc_id if short else f"{tenant}\x1f{doc_id}").encode("utf-8")


def split_kb_key(key: str) -> tuple[str, str]:
    """(tenant, doc_id) of a `kb_key` read as text; a key without U+001F is the default's."""
    tenant, sep, doc_id = key.partition("\x1f")
    return (tenant, doc_id) if sep else ("default", key)


def chunk_key(tenant: str, chunk_id: str) -> bytes:
    """The `rag.chunks` key of a chunk (JSON, so no doc or chunk id can collide)."""
    return json.dumps(["chunk", tenant, chunk_id], separators=(",", ":")).encode("utf-8")


def indexed_doc_key(tenant: str, doc_id: str) -> bytes:
    """The `rag.chunks` key of a document's committed version."""
    return json.dumps(["doc", tenant, doc_id], separators=(",", ":")).encode("utf-8")


def split_chunks_key(key: bytes) -> tuple[str, str, str]:
    """("chunk" or "doc", tenant, chunk or doc id) of a `rag.chunks` key; ValueError if
    it is not one."""
    try:
        parts = json.loads(key.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a rag.chunks key: {exc}") from None
    ok = isinstance(parts, list) and len(parts) == 3 and all(isinstance(p, str) for p in parts)
    if not ok or parts[0] not in ("chunk", "doc") or not parts[1] or not parts[2]:
        raise ValueError('not a rag.chunks key (["chunk"|"doc", tenant, id])')
    return parts[0], parts[1], parts[2]


def chunk_partition_key(tenant: str, doc_id: str) -> bytes:
    """What picks the `rag.chunks` partition of every record of a document."""
    return kb_key(tenant, doc_id)


def prefixed(prefix: str) -> list[TopicSpec]:
    """The topic specs with every name prefixed (one namespace per test run or deployment)."""
    return [
        TopicSpec(prefix + t.name, t.key, t.partitions, dict(t.config)) for t in TOPICS.values()
    ]
