"""The index replica's pure pieces: rag.chunks records out and back, and what a replica does
with them (versions decide, never arrival order)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag.chunking import content_hash
from rag.replica import ReplicaView, plan_batch
from rag.store import DocRecord
from schemas import IndexedChunk, IndexedDoc, SchemaError, encode
from schemas.chunks import Tombstone, decode_record
from schemas.events import VERSION_HEADER, pack_vector, unpack_vector
from schemas.topics import chunk_key, chunk_partition_key, indexed_doc_key, split_chunks_key
from tests.unit.replica_kit import publish, vec


def read(records) -> list:
    return [decode_record(r.key, r.value, list(r.headers)) for r in records]


def held(view: ReplicaView, doc_id: str, tenant: str = "t") -> dict[str, tuple[int, str]]:
    return {cid: v for (t, cid), v in view.chunks.items() if t == tenant
            and cid.rpartition("#")[0] == doc_id}


def apply(view: ReplicaView, records) -> ReplicaView:
    plan_batch(read(records), view)
    return view


# --- the codec -----------------------------------------------------------------------------


def test_records_round_trip_in_document_order_and_one_partition():
    out = publish("a.md", 7, ["one", "two"], before=["one", "two", "three"])
    assert [split_chunks_key(r.key)[0] for r in out] == ["chunk", "chunk", "chunk", "doc"]
    assert {r.partition_key for r in out} == {chunk_partition_key("t", "a.md")}
    first, second, gone, doc = read(out)
    assert isinstance(first, IndexedChunk) and first.chunk_id == "a.md#0"
    assert first.version == 7 and first.content_hash == content_hash("one")
    np.testing.assert_array_equal(np.asarray(first.floats(), np.float32), vec("one"))
    assert gone == Tombstone("t", "a.md#2", 7)
    assert isinstance(doc, IndexedDoc) and (doc.version, doc.slots, doc.deleted) == (7, 3, False)


def test_vectors_travel_as_float32_base64_or_json_floats():
    values = [0.25, -1.5, 3.0]
    assert unpack_vector(pack_vector(values)) == values
    base = dict(tenant="t", doc_id="d", ordinal=0, content_hash="ab" * 32, text="x", tokens=1,
                version=1)
    assert IndexedChunk(**base, vector=values).floats() == values
    with pytest.raises(ValueError, match="exactly one"):
        IndexedChunk(**base)
    with pytest.raises(ValueError, match="NaN or infinity"):
        IndexedChunk(**base, vector=[1.0, float("nan")])
    with pytest.raises(ValueError, match="vector_b64"):
        IndexedChunk(**base, vector_b64="abc")  # not whole float32 values


def _chunk_value(**change) -> bytes:
    record = IndexedChunk(tenant="t", doc_id="d", ordinal=0, content_hash="ab" * 32, text="x",
                          tokens=1, version=1, vector=[1.0, 0.0])
    return encode(record.model_copy(update=change))


@pytest.mark.parametrize(
    ("key", "value", "headers", "field"),
    [
        (b"d#0", _chunk_value(), [], "key"),  # not a rag.chunks key
        (chunk_key("t", "d#1"), _chunk_value(), [], "key"),  # names another chunk
        (chunk_key("u", "d#0"), _chunk_value(), [], "key"),  # another tenant
        (indexed_doc_key("t", "d"), _chunk_value(), [], "schema_name"),  # a chunk under a doc key
        (chunk_key("t", "d#0"), None, [], f"headers.{VERSION_HEADER}"),  # tombstone, no version
        (chunk_key("t", "d#0"), None, [(VERSION_HEADER, b"-1")], f"headers.{VERSION_HEADER}"),
        (chunk_key("t", "nohash"), None, [(VERSION_HEADER, b"1")], "key"),
        (indexed_doc_key("t", "d"), None, [(VERSION_HEADER, b"1")], "key"),
        (chunk_key("t", "d#0"), b"\x80\x04pickle", [], "<record>"),
    ],
)
def test_bad_records_name_the_field(key, value, headers, field):
    with pytest.raises(SchemaError) as info:
        decode_record(key, value, headers)
    assert info.value.field == field


def test_a_nan_vector_on_the_wire_is_refused():
    raw = json.loads(_chunk_value())
    raw["vector"] = None
    raw["vector_b64"] = pack_vector([1.0, float("inf")])
    with pytest.raises(SchemaError, match="NaN or infinity"):
        decode_record(chunk_key("t", "d#0"), json.dumps(raw).encode())


# --- what a replica does -----------------------------------------------------------------------


def test_a_fresh_replica_applies_versions_in_order_and_drops_removed_chunks():
    view = ReplicaView()
    apply(view, publish("a", 1, ["x", "y", "z"]))
    apply(view, publish("a", 2, ["x", "Y"], before=["x", "y", "z"]))
    assert held(view, "a") == {"a#0": (2, content_hash("x")), "a#1": (2, content_hash("Y"))}
    assert view.docs[("t", "a")] == DocRecord("a", "t", 2, False, 3)


def test_the_owner_reading_back_its_older_records_keeps_the_newer_state():
    v1 = publish("a", 1, ["x", "y", "z"])
    v2 = publish("a", 2, ["x"], before=["x", "y", "z"])
    v3 = publish("a", 3, ["x", "y", "w"], before=["x"])
    owner = apply(ReplicaView(), v1 + v2 + v3)
    final = dict(owner.chunks)
    plan = plan_batch(read(v1 + v2), owner)  # its consumer lagging behind its own writes
    assert (plan.upserts, plan.deletes, plan.docs) == ({}, set(), {})
    assert owner.chunks == final and owner.docs[("t", "a")].version == 3


def test_a_commit_drops_chunks_stamped_older_even_without_their_tombstones():
    """An instance that took a partition over while its replica lagged diffed against an
    older version, so it sent no tombstone for a chunk only the newer one had."""
    view = apply(ReplicaView(), publish("a", 1, ["x"]) + publish("a", 2, ["x", "y", "z"]))
    takeover = publish("a", 3, ["x", "q"], before=["x"], slots=1)  # no tombstone for a#2
    assert not any(r.value is None for r in takeover)
    plan = plan_batch(read(takeover), view)
    assert held(view, "a") == {"a#0": (3, content_hash("x")), "a#1": (3, content_hash("q"))}
    assert plan.pruned == 1 and ("t", "a#2") in plan.deletes
    assert view.docs[("t", "a")].slots == 3  # the bound never shrinks


def test_a_deleted_document_leaves_nothing_and_a_later_upsert_comes_back():
    view = apply(ReplicaView(), publish("a", 1, ["x", "y"]))
    apply(view, publish("a", 2, [], before=["x", "y"], deleted=True))
    assert held(view, "a") == {} and view.docs[("t", "a")].deleted
    apply(view, publish("a", 3, ["n"], before=[]))
    assert held(view, "a") == {"a#0": (3, content_hash("n"))}


def test_an_identical_record_is_not_written_again_and_tenants_stay_apart():
    view = apply(ReplicaView(), publish("a", 1, ["x"]))
    again = plan_batch(read(publish("a", 1, ["x"])), view)
    assert (again.upserts, again.docs, again.skipped) == ({}, {}, 2)
    apply(view, publish("a", 1, ["other"], tenant="u"))
    assert held(view, "a") == {"a#0": (1, content_hash("x"))}
    assert held(view, "a", "u") == {"a#0": (1, content_hash("other"))}


def test_an_older_tombstone_keeps_a_chunk_written_again_later():
    view = apply(ReplicaView(), publish("a", 5, ["x", "y"]))
    plan = plan_batch([Tombstone("t", "a#1", 4)], view)
    assert plan.deletes == set() and ("t", "a#1") in view.chunks


texts = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=5)


@settings(max_examples=60, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6), st.integers(0, 40), st.booleans())
def test_any_replay_ends_at_the_latest_version(versions, cut, split):
    """Whatever a replica held before (nothing, a prefix of the log, or the newest state as
    the owner does) and however the log is cut into batches, applying it to its end leaves
    exactly the latest version's chunks."""
    log, before, bound = [], [], 0
    for n, version_texts in enumerate(versions, start=1):
        bound = max(bound, len(version_texts))
        log += publish("a", n, version_texts, before=before, slots=bound)
        before = version_texts
    expect = {f"a#{i}": (len(versions), content_hash(t)) for i, t in enumerate(versions[-1])}
    for start in (ReplicaView(), apply(ReplicaView(), log[: cut % (len(log) + 1)]),
                  apply(ReplicaView(), log)):
        at = cut % (len(log) + 1) if split else len(log)
        apply(start, log[:at])
        apply(start, log[at:])
        assert held(start, "a") == expect
        assert start.docs[("t", "a")].version == len(versions)


def test_a_document_naming_more_slots_than_the_bound_is_refused():
    """The defect: an IndexedDoc could name 1,000,000 slots, and every lookup of that
    document (the replica's view, `current_chunks`) expanded them all."""
    from schemas.events import MAX_SLOTS

    assert MAX_SLOTS <= 65_536
    doc = {"schema_name": "indexed_doc", "tenant": "t", "doc_id": "a", "version": 1,
           "slots": 1_000_000}
    with pytest.raises(SchemaError, match="slots"):
        decode_record(indexed_doc_key("t", "a"), json.dumps(doc).encode())
