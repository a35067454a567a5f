"""Incremental, idempotent indexing of document changes: chunk, diff, embed only new hashes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rag.chunking import Chunk, Tokenizer, chunk_document
from rag.embed import TextEmbedder
from rag.settings import RagSettings
from rag.store import ChunkStore, DocRecord, DocWrite, StoredChunk
from schemas import ChunkRef, KbChange, SchemaError
from schemas.events import MAX_SLOTS


@dataclass(frozen=True)
class ChunkDiff:
    """How a document's chunk refs moved from one version to the next (by chunk id)."""

    added: tuple[ChunkRef, ...] = ()  # ids that did not exist
    changed: tuple[ChunkRef, ...] = ()  # ids that exist with a new hash (new refs)
    replaced: tuple[ChunkRef, ...] = ()  # the old refs of `changed`
    removed: tuple[ChunkRef, ...] = ()  # ids that no longer exist (old refs)
    unchanged: tuple[ChunkRef, ...] = ()

    @property
    def stale(self) -> tuple[ChunkRef, ...]:
        """Old refs that are no longer current: every prefix built on one is invalid."""
        return self.replaced + self.removed

    @property
    def fresh(self) -> tuple[ChunkRef, ...]:
        """New refs that were not current before."""
        return self.added + self.changed


def diff_refs(old: Sequence[ChunkRef], new: Sequence[ChunkRef]) -> ChunkDiff:
    """Compare two chunk sets of one document."""
    before = {r.chunk_id: r for r in old}
    after = {r.chunk_id: r for r in new}
    return ChunkDiff(
        added=tuple(r for r in new if r.chunk_id not in before),
        changed=tuple(r for r in new if r.chunk_id in before and before[r.chunk_id] != r),
        replaced=tuple(r for r in old if r.chunk_id in after and after[r.chunk_id] != r),
        removed=tuple(r for r in old if r.chunk_id not in after),
        unchanged=tuple(r for r in new if before.get(r.chunk_id) == r),
    )


def stored_version(record: DocRecord | None) -> int | None:
    """The version a change is compared with (`KbChange.is_stale`); None if none is stored."""
    return record.version if record is not None else None


@dataclass(frozen=True)
class IndexResult:
    """What indexing one change did. `applied=False`: older than the stored version, ignored."""

    doc_id: str
    tenant: str
    version: int
    op: str
    applied: bool
    previous_version: int | None
    chunks: tuple[Chunk, ...]  # the document's current chunks afterwards
    old_refs: tuple[ChunkRef, ...]
    new_refs: tuple[ChunkRef, ...]
    diff: ChunkDiff = field(default_factory=ChunkDiff)
    embedded: int = 0  # embeddings computed for this change (the rest were reused)

    @property
    def added(self) -> tuple[ChunkRef, ...]:
        return self.diff.added

    @property
    def changed(self) -> tuple[ChunkRef, ...]:
        return self.diff.changed

    @property
    def removed(self) -> tuple[ChunkRef, ...]:
        return self.diff.removed

    @property
    def unchanged(self) -> tuple[ChunkRef, ...]:
        return self.diff.unchanged

    @property
    def content_changed(self) -> bool:
        """False for a re-ingest of identical content (extend TTLs instead of re-warming)."""
        return self.applied and bool(self.diff.stale or self.diff.fresh)


@dataclass
class _Plan:
    change: KbChange
    record: DocRecord | None
    old: list[StoredChunk]
    new: list[Chunk]
    diff: ChunkDiff
    embedded: int = 0

    @property
    def stale(self) -> bool:
        return self.change.is_stale(stored_version(self.record))


class Indexer:
    """Applies `KbChange`s to a `ChunkStore`: chunk, diff against the stored chunks, embed
    only hashes never seen, write. A change cut short by a crash can simply be re-applied."""

    def __init__(
        self,
        store: ChunkStore,
        embedder: TextEmbedder,
        tokenizer: Tokenizer,
        chunk_tokens: int = 256,
        overlap: int = 0,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.overlap = overlap

    @classmethod
    def from_settings(
        cls, store: ChunkStore, embedder: TextEmbedder, tokenizer: Tokenizer, settings: RagSettings
    ) -> Indexer:
        return cls(store, embedder, tokenizer, settings.chunk_tokens, settings.chunk_overlap)

    def chunk(self, doc_id: str, text: str) -> list[Chunk]:
        return chunk_document(doc_id, text, self.tokenizer, self.chunk_tokens, self.overlap)

    def index_document(self, change: KbChange) -> IndexResult:
        return self.index_documents([change])[0]

    def index_documents(self, changes: Iterable[KbChange]) -> list[IndexResult]:
        """Index changes in order, embedding the new hashes of a run of documents together."""
        results: list[IndexResult] = []
        batch: list[KbChange] = []
        seen: set[tuple[str, str]] = set()
        for change in changes:
            # A document seen twice waits for the batch holding its earlier change.
            if (change.tenant, change.doc_id) in seen:
                results.extend(self._index_batch(batch))
                batch, seen = [], set()
            batch.append(change)
            seen.add((change.tenant, change.doc_id))
        results.extend(self._index_batch(batch))
        return results

    def _index_batch(self, changes: list[KbChange]) -> list[IndexResult]:
        plans = [self._plan(c) for c in changes]
        live = [p for p in plans if not p.stale]
        vectors = self._vectors(live)
        return [
            _stale_result(p) if p.stale else self._apply(p, vectors)
            for p in plans
        ]

    def _plan(self, change: KbChange) -> _Plan:
        record = self.store.doc_record(change.doc_id, change.tenant)
        old = self.store.current_chunks(change.doc_id, change.tenant)
        if change.is_stale(stored_version(record)):
            return _Plan(change, record, old, [], ChunkDiff())
        new = self.chunk(change.doc_id, change.text or "") if change.op == "upsert" else []
        if len(new) > MAX_SLOTS:
            # Its IndexedDoc could not name them (nor a replica expand them on every lookup).
            raise SchemaError("text", f"splits into {len(new)} chunks; at most {MAX_SLOTS}")
        diff = diff_refs([s.chunk.ref for s in old], [c.ref for c in new])
        return _Plan(change, record, old, new, diff)

    def _vectors(self, plans: list[_Plan]) -> dict[str, np.ndarray]:
        """Vectors of every fresh hash: reused from the store, else embedded once each."""
        texts = {c.content_hash: c.text for p in plans for c in p.new}
        needed = {r.content_hash for p in plans for r in p.diff.fresh}
        vectors = self.store.vectors_by_hash(needed)
        missing = sorted(needed - vectors.keys())
        if missing:
            rows = self.embedder.embed([texts[h] for h in missing])
            computed = dict(zip(missing, rows, strict=True))
            self.store.save_vectors(computed)
            vectors.update(computed)
        # Each computed embedding is credited to the first change that needed it.
        unclaimed = set(missing)
        for plan in plans:
            mine = {r.content_hash for r in plan.diff.fresh} & unclaimed
            plan.embedded = len(mine)
            unclaimed -= mine
        return vectors

    def _apply(self, plan: _Plan, vectors: dict[str, np.ndarray]) -> IndexResult:
        change, diff = plan.change, plan.diff
        fresh = {r.chunk_id for r in diff.fresh}
        kept = {r.chunk_id for r in diff.unchanged}
        write = [c for c in plan.new if c.chunk_id in fresh]
        deleted = change.op == "delete"
        record = DocRecord(change.doc_id, change.tenant, change.version, deleted, len(plan.new))
        self.store.write_document(
            DocWrite(
                record=record,
                upserts=write,
                vectors=[vectors[c.content_hash] for c in write],
                restamp=[
                    s.chunk.chunk_id
                    for s in plan.old
                    if s.chunk.chunk_id in kept and s.version != change.version
                ],
                deletes=[r.chunk_id for r in diff.removed],
            )
        )
        return IndexResult(
            doc_id=change.doc_id,
            tenant=change.tenant,
            version=change.version,
            op=change.op,
            applied=True,
            previous_version=plan.record.version if plan.record else None,
            chunks=tuple(plan.new),
            old_refs=tuple(s.chunk.ref for s in plan.old),
            new_refs=tuple(c.ref for c in plan.new),
            diff=diff,
            embedded=plan.embedded,
        )


def _stale_result(plan: _Plan) -> IndexResult:
    current = tuple(s.chunk for s in plan.old)
    refs = tuple(c.ref for c in current)
    return IndexResult(
        doc_id=plan.change.doc_id,
        tenant=plan.change.tenant,
        version=plan.change.version,
        op=plan.change.op,
        applied=False,
        previous_version=plan.record.version if plan.record else None,
        chunks=current,
        old_refs=refs,
        new_refs=refs,
    )
