"""`ragwarm.rag_port.stale_refs`: which refs a by-id lookup of the index calls stale (pure)."""

from __future__ import annotations

from ragwarm.rag_port import stale_refs
from schemas import ChunkRef

H = {name: (name * 16)[:16] for name in ("a", "b", "c", "d")}  # valid hex content hashes


def ref(chunk_id: str, content_hash: str) -> ChunkRef:
    return ChunkRef(chunk_id=chunk_id, content_hash=content_hash)


def test_current_refs_are_not_stale() -> None:
    held = {"faq.md#16": (H["a"], 1028), "faq.md#22": (H["b"], 1028)}
    assert stale_refs([ref("faq.md#16", H["a"]), ref("faq.md#22", H["b"])], held) == []


def test_a_changed_hash_names_what_is_stored_instead() -> None:
    held = {"faq.md#16": (H["c"], 1028), "faq.md#22": (H["b"], 1028)}
    refs = [ref("faq.md#16", H["d"]), ref("faq.md#22", H["b"])]
    assert stale_refs(refs, held) == [("faq.md#16", H["d"], H["c"], 1028)]


def test_an_absent_chunk_is_stale_with_nothing_stored() -> None:
    assert stale_refs([ref("faq.md#40", H["c"])], {}) == [("faq.md#40", H["c"], None, None)]
