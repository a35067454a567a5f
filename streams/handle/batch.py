"""KB changes in batches: one index call (embeddings batched across documents), then each
change recorded in order, as `handlers.on_kb_change` records one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas import KbChange
from streams.decide.records import DocState, doc_key
from streams.handle.handlers import HandlerDeps, publish_indexed


def live_changes(docs: Mapping[str, Any], changes: Sequence[KbChange]) -> list[bool]:
    """Per change, whether it is newer than the docs table and the batch's earlier changes
    of its document (`docs`: doc_key -> stored DocState JSON); older ones index nothing."""
    newest: dict[str, int] = {}
    live = []
    for change in changes:
        key = doc_key(change.tenant, change.doc_id)
        version = newest.get(key)
        if version is None:
            raw = docs.get(key)
            version = DocState.model_validate(raw).version if raw else None
        stale = change.is_stale(version)
        live.append(not stale)
        if not stale:
            newest[key] = change.version
    return live


async def index_batch(p: HandlerDeps, changes: Sequence[KbChange]) -> list[dict[str, str] | None]:
    """Index the live changes in one call, in order; per change its chunk hashes after it
    (None: older than what the table or the store holds)."""
    live = live_changes(p.tables.docs, changes)
    todo = [c for c, ok in zip(changes, live, strict=True) if ok]
    indexed = iter(await p.blocking(p.rag.index_many, todo) if todo else [])
    if todo:
        await publish_indexed(p)
    return [next(indexed) if ok else None for ok in live]
