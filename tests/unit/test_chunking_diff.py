"""Chunk-set diffs and version ordering: what an index change reports, without a store."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rag.index import diff_refs, stored_version
from rag.store import DocRecord
from schemas import ChunkRef, KbChange


def _ref(ordinal: int, h: str) -> ChunkRef:
    return ChunkRef(chunk_id=f"d#{ordinal}", content_hash=h * 64)


def test_diff_categories() -> None:
    old = [_ref(0, "a"), _ref(1, "b"), _ref(2, "c")]
    new = [_ref(0, "a"), _ref(1, "e"), _ref(3, "f")]
    diff = diff_refs(old, new)
    assert diff.unchanged == (_ref(0, "a"),)
    assert diff.changed == (_ref(1, "e"),) and diff.replaced == (_ref(1, "b"),)
    assert diff.added == (_ref(3, "f"),)
    assert diff.removed == (_ref(2, "c"),)
    assert set(diff.stale) == {_ref(1, "b"), _ref(2, "c")}
    assert set(diff.fresh) == {_ref(1, "e"), _ref(3, "f")}


def test_identical_sets_are_all_unchanged() -> None:
    refs = [_ref(0, "a"), _ref(1, "b")]
    diff = diff_refs(refs, refs)
    assert diff.unchanged == tuple(refs) and not diff.stale and not diff.fresh


def _change(version: int) -> KbChange:
    return KbChange(op="delete", doc_id="d", version=version)


def test_older_versions_are_stale_equal_ones_are_not() -> None:
    record = DocRecord("d", "default", 5, deleted=False)
    assert _change(4).is_stale(stored_version(record))
    assert not _change(5).is_stale(stored_version(record))
    assert not _change(6).is_stale(stored_version(record))
    assert not _change(0).is_stale(stored_version(None))
    assert _change(3).is_stale(stored_version(DocRecord("d", "default", 5, deleted=True)))
    # A first write that was interrupted left no version: anything may apply.
    assert not _change(0).is_stale(
        stored_version(DocRecord("d", "default", None, deleted=False, slots=4)))


_refsets = st.dictionaries(st.integers(0, 12), st.sampled_from("abcdef"), max_size=10).map(
    lambda d: [_ref(k, v) for k, v in sorted(d.items())]
)


@given(old=_refsets, new=_refsets)
def test_diff_partitions_both_sides(old: list[ChunkRef], new: list[ChunkRef]) -> None:
    diff = diff_refs(old, new)
    assert sorted(diff.fresh + diff.unchanged, key=str) == sorted(new, key=str)
    assert sorted(diff.stale + diff.unchanged, key=str) == sorted(old, key=str)
    assert [r.chunk_id for r in diff.changed] == [r.chunk_id for r in diff.replaced]
    # Applying the diff to the old set gives the new set.
    assert (set(old) - set(diff.stale)) | set(diff.fresh) == set(new)
