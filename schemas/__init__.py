"""Event models shared by every part of ragwarm; this package imports nothing else of ours."""

from schemas.codec import SchemaError, decode, encode, registry
from schemas.events import (
    MAX_TEXT_BYTES,
    MAX_TTL_S,
    ChunkRef,
    DeadLetter,
    Event,
    IndexedChunk,
    IndexedDoc,
    KbChange,
    QueryEvent,
    WarmupCommand,
    WorkerEvent,
)
from schemas.topics import TOPICS, TopicSpec

__all__ = [
    "MAX_TEXT_BYTES",
    "MAX_TTL_S",
    "TOPICS",
    "ChunkRef",
    "DeadLetter",
    "Event",
    "IndexedChunk",
    "IndexedDoc",
    "KbChange",
    "QueryEvent",
    "SchemaError",
    "TopicSpec",
    "WarmupCommand",
    "WorkerEvent",
    "decode",
    "encode",
    "registry",
]
