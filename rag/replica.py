"""The index replicated through `rag.chunks`: records out of an indexed document, records
into a replica, and what a replica does with each.

The instance owning a document's `kb.changes` partition embeds and writes it to its own
store, then publishes every chunk current at the new version (vectors included), a
tombstone per removed chunk, and last an `IndexedDoc` committing the version. Every
instance, the owner too, applies the topic to its store (`plan_batch`). Versions decide,
never arrival order: a record older than what the replica holds is skipped, so the
owner reading back its own earlier records, or an instance that took a partition over
while its replica lagged, never regresses. Committing version v drops the document's
chunks stamped older than v (every chunk current at v was re-published at v), so a
missed tombstone cannot leave a stale chunk behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rag.chunking import Chunk, chunk_id
from rag.store import ChunkStore, DocRecord, StoredChunk
from schemas import IndexedChunk, IndexedDoc, SchemaError, encode
from schemas.chunks import Outgoing, RefusedRecords, ReplicaRecord, Tombstone
from schemas.events import VERSION_HEADER, pack_vector
from schemas.topics import chunk_key, chunk_partition_key, indexed_doc_key

ChunkKey = tuple[str, str]  # (tenant, chunk_id)
DocKey = tuple[str, str]  # (tenant, doc_id)


# --- out: what the owner publishes ---------------------------------------------------------


def outgoing(
    record: DocRecord,
    chunks: Sequence[Chunk],
    vectors: Mapping[str, np.ndarray],
    removed: Iterable[str] = (),
) -> list[Outgoing]:
    """The records of one document at `record.version`: every current chunk, a tombstone
    per removed chunk id, then the commit."""
    tenant, doc_id = record.tenant, record.doc_id
    assert record.version is not None  # a committed version is always known
    part = chunk_partition_key(tenant, doc_id)
    version = record.version
    out = [
        Outgoing(chunk_key(tenant, c.chunk_id),
                 encode(_chunk_event(tenant, c, version, vectors[c.content_hash])), part)
        for c in chunks
    ]
    header = ((VERSION_HEADER, str(version).encode("ascii")),)
    out += [Outgoing(chunk_key(tenant, cid), None, part, header) for cid in removed]
    doc = IndexedDoc(tenant=tenant, doc_id=doc_id, version=version,
                     deleted=record.deleted, slots=record.slots)
    out.append(Outgoing(indexed_doc_key(tenant, doc_id), encode(doc), part))
    return out


def _chunk_event(tenant: str, chunk: Chunk, version: int, vector: np.ndarray) -> IndexedChunk:
    return IndexedChunk(
        tenant=tenant, doc_id=chunk.doc_id, ordinal=chunk.ordinal,
        content_hash=chunk.content_hash, text=chunk.text, tokens=chunk.tokens,
        version=version, vector_b64=pack_vector([float(x) for x in vector]),
    )


# --- the decision: what a replica does with a batch -----------------------------------------


@dataclass
class ReplicaView:
    """What the replica holds for the keys a batch touches (updated as it is planned)."""

    chunks: dict[ChunkKey, tuple[int, str]] = field(default_factory=dict)  # version, hash
    docs: dict[DocKey, DocRecord] = field(default_factory=dict)


@dataclass
class ReplicaPlan:
    """The writes a batch comes to, each key once, and what it skipped."""

    upserts: dict[ChunkKey, IndexedChunk] = field(default_factory=dict)
    deletes: set[ChunkKey] = field(default_factory=set)
    docs: dict[DocKey, DocRecord] = field(default_factory=dict)
    skipped: int = 0
    pruned: int = 0


def plan_batch(records: Iterable[ReplicaRecord], view: ReplicaView) -> ReplicaPlan:
    """Apply `records` in order to `view`; the writes that bring the store to it."""
    plan = ReplicaPlan()
    for record in records:
        if isinstance(record, IndexedChunk):
            _plan_chunk(record, view, plan)
        elif isinstance(record, Tombstone):
            _plan_tombstone(record, view, plan)
        else:
            _plan_doc(record, view, plan)
    return plan


def _plan_chunk(record: IndexedChunk, view: ReplicaView, plan: ReplicaPlan) -> None:
    key = (record.tenant, record.chunk_id)
    doc = view.docs.get((record.tenant, record.doc_id))
    held = view.chunks.get(key)
    older_doc = doc is not None and doc.version is not None and doc.version > record.version
    if older_doc or (held is not None and held[0] > record.version) or (
        held == (record.version, record.content_hash)
    ):
        plan.skipped += 1
        return
    view.chunks[key] = (record.version, record.content_hash)
    plan.upserts[key] = record
    plan.deletes.discard(key)


def _plan_tombstone(record: Tombstone, view: ReplicaView, plan: ReplicaPlan) -> None:
    key = (record.tenant, record.chunk_id)
    held = view.chunks.get(key)
    if held is None or held[0] > record.version:
        plan.skipped += 1  # nothing held, or written again at a later version
        return
    _drop(key, view, plan)


def _plan_doc(record: IndexedDoc, view: ReplicaView, plan: ReplicaPlan) -> None:
    key = (record.tenant, record.doc_id)
    held = view.docs.get(key)
    if held is not None and held.version is not None and held.version > record.version:
        plan.skipped += 1
        return
    slots = max(record.slots, held.slots if held else 0)
    new = DocRecord(record.doc_id, record.tenant, record.version, record.deleted, slots)
    if new == held:
        # Committed before, and pruned then; older chunk records are skipped since.
        plan.skipped += 1
        return
    view.docs[key] = plan.docs[key] = new
    for ordinal in range(slots):
        one = (record.tenant, chunk_id(record.doc_id, ordinal))
        found = view.chunks.get(one)
        if found is not None and found[0] < record.version:
            _drop(one, view, plan)
            plan.pruned += 1


def _drop(key: ChunkKey, view: ReplicaView, plan: ReplicaPlan) -> None:
    view.chunks.pop(key, None)
    plan.upserts.pop(key, None)
    plan.deletes.add(key)


# --- the store side ----------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """What one batch did to the replica."""

    written: int
    deleted: int
    docs: int
    skipped: int
    pruned: int


def apply_batch(store: ChunkStore, records: Sequence[ReplicaRecord]) -> Applied:
    """Bring `store` to `records` applied in order (one read of the keys, one write);
    `RefusedRecords` before any write when some cannot be held (`refused`)."""
    if bad := refused(records, store.dim, store.collection):
        raise RefusedRecords(bad)
    view = load_view(store, records)
    plan = plan_batch(records, view)
    chunks = [(_stored(r), np.asarray(r.floats(), dtype=np.float32))
              for r in plan.upserts.values()]
    store.apply_replicated(chunks, sorted(plan.deletes), list(plan.docs.values()))
    return Applied(len(chunks), len(plan.deletes), len(plan.docs), plan.skipped, plan.pruned)


def refused(records: Sequence[ReplicaRecord], dim: int, collection: str) -> dict[int, SchemaError]:
    """Position -> why, of the records a store of `dim`-sized vectors cannot hold. A chunk
    embedded by another model (a rolling upgrade to another embedder) made the store's
    write fail on every attempt, and the replica retried that batch for good."""
    out: dict[int, SchemaError] = {}
    for i, r in enumerate(records):
        if isinstance(r, IndexedChunk) and (n := len(r.floats())) != dim:
            out[i] = SchemaError("vector", f"{n} values; the collection {collection!r} holds "
                                 f"{dim}-dimensional vectors (another embedder?)")
    return out


def load_view(store: ChunkStore, records: Sequence[ReplicaRecord]) -> ReplicaView:
    """The store's state of every document and chunk `records` can touch."""
    doc_keys = {(r.tenant, r.doc_id) for r in records}
    docs = store.doc_records_of(doc_keys)
    wanted: dict[str, set[str]] = {}
    for r in records:
        if not isinstance(r, IndexedDoc):
            wanted.setdefault(r.tenant, set()).add(r.chunk_id)
    for r in records:
        if isinstance(r, IndexedDoc):
            held = docs.get((r.tenant, r.doc_id))
            slots = max(r.slots, held.slots if held else 0)
            ids = wanted.setdefault(r.tenant, set())
            ids.update(chunk_id(r.doc_id, i) for i in range(slots))
    view = ReplicaView(docs=dict(docs))
    for tenant, ids in wanted.items():
        for cid, s in store.get_chunks(sorted(ids), tenant).items():
            view.chunks[(tenant, cid)] = (s.version, s.chunk.content_hash)
    return view


def _stored(record: IndexedChunk) -> StoredChunk:
    chunk = Chunk(record.doc_id, record.ordinal, record.text, record.content_hash, record.tokens)
    return StoredChunk(chunk, record.tenant, record.version)
