"""`rag.chunks` records on the wire: the record types a replica reads, and their decoder.

Values are `IndexedChunk` / `IndexedDoc` events (`schemas.events`); a removed chunk is a
tombstone (a null value) whose document version travels in the `ragwarm-version` header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.codec import SchemaError, decode
from schemas.events import VERSION_HEADER, IndexedChunk, IndexedDoc
from schemas.topics import split_chunks_key


@dataclass(frozen=True)
class Tombstone:
    """A removed chunk: a null value on `rag.chunks`, its version in a header."""

    tenant: str
    chunk_id: str
    version: int

    @property
    def doc_id(self) -> str:
        return self.chunk_id.rpartition("#")[0]


ReplicaRecord = IndexedChunk | IndexedDoc | Tombstone


@dataclass(frozen=True)
class Outgoing:
    """One record to publish: key, value (None: tombstone), headers, and the key that
    picks its partition (the document's, so a document's records stay in order)."""

    key: bytes
    value: bytes | None
    partition_key: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


class RefusedRecords(SchemaError):
    """Valid records of a batch that a replica's store cannot hold (a vector of another size
    than its collection's: an instance running another embedder), by their position in the
    batch. Raised before anything of the batch is written: the caller dead-letters those
    and applies the rest, so one such record never stops the replica."""

    def __init__(self, refused: Mapping[int, SchemaError]) -> None:
        first = refused[min(refused)]
        super().__init__(first.field, f"{len(refused)} record(s) refused, the first: "
                         f"{first.message}")
        self.refused = dict(refused)


def decode_record(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] = ()
) -> ReplicaRecord:
    """One `rag.chunks` record; `SchemaError` naming the field when it is not a valid one
    (its key must name the record it holds)."""
    try:
        kind, tenant, ident = split_chunks_key(key or b"")
    except ValueError as exc:
        raise SchemaError("key", str(exc)) from None
    if value is None:
        if kind != "chunk":
            raise SchemaError("key", "a tombstone must be keyed by a chunk")
        return Tombstone(tenant, _checked_chunk_id(ident), _header_version(headers))
    record = decode(value)
    if isinstance(record, IndexedChunk) and kind == "chunk":
        if (record.tenant, record.chunk_id) != (tenant, ident):
            raise SchemaError("key", "does not name the chunk the record holds")
        return record
    if isinstance(record, IndexedDoc) and kind == "doc":
        if (record.tenant, record.doc_id) != (tenant, ident):
            raise SchemaError("key", "does not name the document the record holds")
        return record
    raise SchemaError("schema_name", f"a {kind!r} key needs an indexed_{kind} record")


def _checked_chunk_id(ident: str) -> str:
    doc_id, sep, ordinal = ident.rpartition("#")
    if not (doc_id and sep and ordinal.isdigit()):
        raise SchemaError("key", f"not a chunk id (doc_id#ordinal): {ident!r}")
    return ident


def _header_version(headers: Sequence[tuple[str, bytes]]) -> int:
    raw = dict(headers).get(VERSION_HEADER)
    if raw is None or not raw.isdigit() or len(raw) > 19:
        raise SchemaError(f"headers.{VERSION_HEADER}", "a tombstone needs its version")
    return int(raw)
