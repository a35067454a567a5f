"""Batched KB changes: the same table state and ops as one change at a time (no Kafka)."""

from __future__ import annotations

import asyncio
import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import KbChange
from streams.decide.records import DocState
from streams.handle import handlers as h
from tests.unit.conftest import pipeline


class IndexPort:
    """Index = a document's chunk hashes follow its text; remembers each call's batch."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.calls: list[list[str]] = []

    def index(self, change: KbChange) -> dict[str, str] | None:
        return self.index_many([change])[0]

    def index_many(self, changes):
        self.calls.append([f"{c.doc_id}@{c.version}" for c in changes])
        out = []
        for c in changes:
            if c.version < self.versions.get(c.doc_id, -1):
                out.append(None)
                continue
            self.versions[c.doc_id] = c.version
            out.append({f"{c.doc_id}#0": digest(c.text or "")})
        return out


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def change(doc: str, version: int, text: str = "x") -> KbChange:
    return KbChange(op="upsert", doc_id=doc, version=version, text=text)


def linked_pipeline(port: IndexPort):
    """A pipeline where one prefix depends on chunk a#0 with the text "one"."""
    p, out = pipeline(port)
    p.tables.doc_prefixes["a"] = {"f" * 64: [{"chunk_id": "a#0", "content_hash": digest("one")}]}
    return p, out


def run_batched(changes: list[KbChange]):
    port = IndexPort()
    p, out = linked_pipeline(port)

    async def go():
        results = await h.index_batch(p, changes)
        for c, chunks in zip(changes, results, strict=True):
            await h.apply_indexed(p, c, chunks)

    asyncio.run(go())
    return p, out, port


def run_single(changes: list[KbChange]):
    port = IndexPort()
    p, out = linked_pipeline(port)

    async def go():
        for c in changes:
            await h.on_kb_change(p, c)

    asyncio.run(go())
    return p, out, port


def test_one_index_call_for_a_batch() -> None:
    _, _, port = run_batched([change("a", 1), change("b", 1), change("c", 2)])
    assert port.calls == [["a@1", "b@1", "c@2"]]


def test_an_older_change_in_the_batch_is_not_indexed() -> None:
    p, _, port = run_batched([change("a", 3, "new"), change("a", 2, "old"), change("b", 1)])
    assert port.calls == [["a@3", "b@1"]]
    assert p.tables.docs["a"]["version"] == 3
    assert p.stats["stale_events"] == 1 and p.stats["kb_events"] == 2


def test_live_changes_checks_the_table_first() -> None:
    docs = {"a": {"version": 5, "tenant": "default", "chunks": {}, "deleted": False}}
    live = h.live_changes(h.Rows(docs, DocState), [change("a", 4), change("a", 5), change("b", 1)])
    assert live == [False, True, True]


def test_invalidations_match_one_at_a_time() -> None:
    """A prefix linked to a document is invalidated by the batch as by single changes."""
    changes = [change("a", 1, "one"), change("a", 2, "two"), change("b", 1)]
    for runner in (run_batched, run_single):
        _, out, _ = runner(changes)
        assert [o.op for o in out.ops] == ["extend_ttl", "invalidate"], runner.__name__


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 5), st.sampled_from(["one", "two"])),
        max_size=12,
    )
)
def test_batched_equals_one_at_a_time(rows) -> None:
    changes = [change(d, v, t) for d, v, t in rows]
    pb, ob, _ = run_batched(changes)
    ps, os_, _ = run_single(changes)
    assert pb.tables.docs == ps.tables.docs
    assert pb.stats == ps.stats
    assert [o.model_dump(exclude={"origin_ts"}) for o in ob.ops] == [
        o.model_dump(exclude={"origin_ts"}) for o in os_.ops
    ]
