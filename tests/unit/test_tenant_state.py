"""Tenant-scoped streams state: the same doc_id in two tenants is two documents."""

from __future__ import annotations

import hashlib
import json

import pytest

from schemas import ChunkRef, KbChange
from schemas.topics import kb_key, split_kb_key
from streams.decide.records import DocLink, DocState, doc_key
from streams.handle import handlers
from streams.shell.recovery import plan_reindex
from streams.sim import run_sync
from tests.unit.conftest import Port, pipeline

PA, PB = "a" * 64, "b" * 64


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class IndexingPort(Port):
    """One chunk per document, hashed from its text, kept per (tenant, chunk id)."""

    def index(self, change: KbChange) -> dict[str, str]:
        chunks = {} if change.op == "delete" else {f"{change.doc_id}#0": sha(change.text or "")}
        for chunk_id, content in chunks.items():
            self.current[(change.tenant, chunk_id)] = content
        return chunks


def upsert(tenant: str, version: int, text: str) -> KbChange:
    return KbChange(op="upsert", doc_id="d.md", version=version, tenant=tenant, text=text)


def test_two_tenants_with_the_same_doc_id_are_indexed_and_invalidated_apart() -> None:
    p, out = pipeline(IndexingPort({}))
    run_sync(handlers.on_kb_change(p, upsert("acme", 5, "acme v5")))
    # A lower version, but of another tenant's document: not stale.
    run_sync(handlers.on_kb_change(p, upsert("globex", 1, "globex v1")))
    assert p.stats.get("stale_events", 0) == 0 and p.stats["kb_events"] == 2
    assert set(p.tables.docs) == {doc_key("acme", "d.md"), doc_key("globex", "d.md")}
    for tenant, prefix, text in (("acme", PA, "acme v5"), ("globex", PB, "globex v1")):
        ref = ChunkRef(chunk_id="d.md#0", content_hash=sha(text))
        link = DocLink(doc_id="d.md", tenant=tenant, prefix_hash=prefix, chunk_refs=[ref])
        run_sync(handlers.on_doc_link(p, link))
    assert not out.ops  # each link matches its own tenant's current chunk

    run_sync(handlers.on_kb_change(p, upsert("acme", 6, "acme v6")))
    assert [(o.op, o.prefix_hash, o.tenant) for o in out.ops] == [("invalidate", PA, "acme")]
    out.ops.clear()
    run_sync(handlers.on_kb_change(p, upsert("globex", 2, "globex v1")))  # same text: TTL only
    assert [(o.op, o.prefix_hash, o.tenant) for o in out.ops] == [("extend_ttl", PB, "globex")]


def test_the_default_tenant_keeps_its_older_keys_and_recovery_reads_both() -> None:
    assert doc_key("default", "d.md") == "d.md" == kb_key("default", "d.md").decode()
    assert split_kb_key(doc_key("acme", "x/y.md")) == ("acme", "x/y.md")
    assert split_kb_key("d.md") == ("default", "d.md")
    docs = {
        "d.md": DocState(version=3, tenant="default"),
        doc_key("acme", "d.md"): DocState(version=7, tenant="acme"),
    }
    need = plan_reindex(docs, {("default", "d.md"): 3})
    assert need == {("acme", "d.md"): 7}


def test_a_doc_link_from_before_tenants_reads_as_the_default_tenant() -> None:
    old = DocLink.model_validate_json(json.dumps({"doc_id": "d.md", "prefix_hash": PA}))
    assert old.tenant == "default"


def test_document_keys_never_collide_across_tenants():
    """The defect: doc_key joined tenant and doc id with U+001F, which ids may hold, so
    ("a", "b\\x1fc") and ("a\\x1fb", "c") shared a key (state, links, partition), and so
    did ("default", "a\\x1fb") and ("a", "b")."""
    from pydantic import ValidationError

    from schemas import KbChange

    pairs = [("a", "b\x1fc"), ("default", "a\x1fb"), ("a", "b"), ("default", "b\x1fc"),
             ("default", "a"), ("b", "a")]
    keys = [doc_key(t, d) for t, d in pairs]
    assert len(set(keys)) == len(pairs)
    assert [split_kb_key(k) for k in keys] == pairs
    with pytest.raises(ValidationError, match="tenant"):
        KbChange(op="delete", doc_id="c", version=1, tenant="a\x1fb")
    with pytest.raises(ValueError, match="U\\+001F"):
        doc_key("a\x1fb", "c")


def test_synthetic_warmup_keys_documents_unambiguously():
    from streams.decide.synthetic import DocCandidate, doc_key_of

    def key(tenant: str, doc_id: str) -> str:
        return doc_key_of(DocCandidate(tenant=tenant, doc_id=doc_id, refs=()))

    assert key("a", "b\x00c") != key("a\x00b", "c")
