"""The streams side of the index replica: a warm op on chunks the replica lacks waits for it
to catch up, indexing publishes before its ops, and bad rag.chunks records are told apart."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from schemas import ChunkRef, IndexedChunk, KbChange, encode
from schemas.events import VERSION_HEADER
from schemas.topics import chunk_key
from streams.decide.records import PrefixOp, PrefixState
from streams.handle import handlers
from streams.handle.ports import WarmPrefix
from streams.shell.replica import decode_batch, next_offsets
from tests.unit.conftest import P1, REFS, IndexPort, Port, pipeline, warm
from tests.unit.replica_kit import publish


class Replica:
    """A replica that applies `pending` to the port when asked to catch up."""

    def __init__(self, port: Port, pending: dict, order: list[str]) -> None:
        self.port, self.pending, self.order = port, pending, order
        self.waits = 0

    async def publish(self) -> None:
        self.order.append("publish")

    async def caught_up(self, timeout_s=None, since=None) -> bool:
        self.waits += 1
        self.port.current.update(self.pending)
        return True


def test_a_warm_op_on_chunks_the_replica_has_not_applied_yet_waits_for_it():
    port = Port({})  # another instance indexed d.md; this replica has not applied it yet
    p, out = pipeline(port)
    p.replica = Replica(port, {("default", "d.md#0"): "1" * 64}, [])
    asyncio.run(handlers.on_prefix_op(p, warm()))
    assert p.replica.waits == 1
    assert [c.op for c in out.commands] == ["prefill"]
    assert p.stats["stale_warm_skipped"] == 0


def test_a_warm_op_on_chunks_that_are_stale_after_catching_up_is_skipped():
    port = Port({("default", "d.md#0"): "2" * 64})
    p, out = pipeline(port)
    p.replica = Replica(port, {}, [])
    asyncio.run(handlers.on_prefix_op(p, warm()))
    assert p.replica.waits == 1 and out.commands == []
    assert p.stats["stale_warm_skipped"] == 1


def test_a_warm_op_on_a_ref_the_replica_has_not_seen_replaced_yet_is_skipped():
    # Another instance indexed an edit of d.md#0 (published, not yet applied here): the
    # local index still calls the old ref current. Checked before catching up, it prefilled
    # KV from the old text.
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port)
    p.replica = Replica(port, {("default", "d.md#0"): "2" * 64}, [])
    asyncio.run(handlers.on_prefix_op(p, warm()))
    assert p.replica.waits == 1 and out.commands == []
    assert p.stats["stale_warm_skipped"] == 1


class LaggingPort(Port):
    """Retrieval over whatever the index holds now: the new prefix once the edit is in."""

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        ref = ChunkRef(chunk_id="d.md#0", content_hash=self.current[(tenant, "d.md#0")])
        new = ref.content_hash != REFS[0].content_hash
        return WarmPrefix(prefix_hash=("f" if new else "a") * 64, token_ids=[8] * 32,
                          chunk_refs=[ref])


def test_an_invalidation_on_a_lagging_replica_rewarms_what_the_edit_retrieves():
    # The edit was indexed on another instance; its invalidation of P1 is handled here. The
    # re-warm retrieves after catching up, so it names the new prefix, not P1 again (which
    # the freshness check would only drop, and the edited question would stay cold).
    port = LaggingPort({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port)
    p.tables.prefix_states[P1] = PrefixState(
        tenant="default", chunk_refs=REFS, token_ids=[7] * 32, questions=["why?"],
        expires_at=1000.0, hot=True,
    )
    p.replica = Replica(port, {("default", "d.md#0"): "2" * 64}, [])
    op = PrefixOp(op="invalidate", prefix_hash=P1, chunk_refs=REFS, reason="d.md v2")
    asyncio.run(handlers.on_prefix_op(p, op))
    assert [(o.op, o.prefix_hash) for o in out.ops] == [("warm", "f" * 64)]
    asyncio.run(handlers.on_prefix_op(p, out.ops[0]))
    assert [c.op for c in out.commands] == ["invalidate", "prefill"]


def test_indexing_publishes_before_recording_and_sending_ops():
    order: list[str] = []

    class IndexingPort(Port):
        def index(self, change):
            order.append("index")
            return {"d.md#0": "1" * 64}

    port = IndexingPort({})
    p, out = pipeline(port)
    p.replica = Replica(port, {}, order)
    change = KbChange(op="upsert", doc_id="d.md", version=1, text="x")
    asyncio.run(handlers.on_kb_change(p, change))
    assert order == ["index", "publish"] and p.stats["kb_events"] == 1


def message(partition: int, offset: int, key: bytes, value: bytes | None, headers=()):
    return SimpleNamespace(topic="rag.chunks", partition=partition, offset=offset, key=key,
                           value=value, headers=list(headers))


def test_a_batch_keeps_the_good_records_in_order_and_names_the_bad_ones():
    records = publish("a", 3, ["x"], before=["x", "y"])
    msgs = [message(1, 10 + i, r.key, r.value, r.headers) for i, r in enumerate(records)]
    msgs.insert(1, message(0, 4, chunk_key("t", "a#5"), None))  # a tombstone with no version
    msgs.append(message(0, 5, b"junk", b"{}"))
    good, bad = decode_batch(msgs)
    assert [type(r).__name__ for _, r in good] == ["IndexedChunk", "Tombstone", "IndexedDoc"]
    assert [m.offset for m, _ in good] == [10, 11, 12]
    assert [(m.offset, e.field) for m, e in bad] == [(4, f"headers.{VERSION_HEADER}"),
                                                     (5, "key")]
    assert next_offsets(msgs) == {0: 6, 1: 13}


def test_recovery_rebuilds_from_the_replica_before_it_re_indexes_anything():
    from streams.decide.records import DocState
    from streams.shell.recovery import recover_index

    port = IndexPort({})  # an empty disk
    p, _ = pipeline(port)
    p.tables.doc_states["a"] = DocState(version=2, tenant="default")
    p.tables.doc_states["b"] = DocState(version=1, tenant="default")
    order: list[str] = []

    class Rebuilding(Replica):
        async def caught_up(self, timeout_s=None, since=None) -> bool:
            self.waits += 1
            port.indexed[("default", "a")] = 2  # rag.chunks held a, never b
            return self.waits > 1  # the first wait runs out, the second completes

    p.replica = Rebuilding(port, {}, order)
    kb = [KbChange(op="upsert", doc_id="b", version=1, text="b")]
    assert asyncio.run(recover_index(p, lambda wanted: kb)) == 1
    assert [c.doc_id for c in port.applied] == ["b"]  # only what no instance published
    assert order == ["publish"] and p.replica.waits == 2


# --- records the store cannot hold -------------------------------------------------------------


class HeldStore:
    """A replica store of `dim`-sized vectors that refuses what `rag.replica.apply_batch`
    refuses (the same check), and keeps what it applied and the offsets saved."""

    def __init__(self, dim: int) -> None:
        self.dim, self.applied, self.offsets = dim, [], {}

    def apply_replicated(self, records):
        from rag.replica import refused
        from schemas.chunks import RefusedRecords

        if bad := refused(records, self.dim, "chunks"):
            raise RefusedRecords(bad)
        self.applied.extend(records)
        return {"written": len(records)}

    def save_replica_offsets(self, name, offsets):
        self.offsets = dict(offsets)


class Sent:
    def __init__(self) -> None:
        self.letters: list[bytes] = []

    async def send(self, key, value):
        self.letters.append(value)


def _replica(store, letters):
    from streams.shell.replica import ChunkReplica

    p, _ = pipeline(Port({}))
    topic = SimpleNamespace(get_topic_name=lambda: "rag.chunks", partitions=4)
    return ChunkReplica(p, store, topic, letters, lambda: None, follow=True), p


def test_a_vector_of_another_size_is_dead_lettered_and_the_rest_applied():
    """The defect: a chunk embedded by another model (a rolling upgrade) failed the store's
    write on every attempt; `apply` retried that batch for good, on every instance, and the
    replica (and start-up recovery, which waits for it) never moved again."""
    from schemas import DeadLetter, decode

    good = publish("a", 1, ["x", "y"])  # 4-dimensional vectors (tests.unit.test_replica.DIM)
    other = publish("b", 1, ["z"])
    wide = IndexedChunk.model_validate({**json.loads(other[0].value), "vector_b64": None,
                                        "vector": [0.5] * 7})
    msgs = [message(0, i, r.key, r.value, r.headers) for i, r in enumerate(good)]
    msgs.insert(1, message(0, 99, other[0].key, encode(wide)))
    store, letters = HeldStore(4), Sent()
    replica, p = _replica(store, letters)
    asyncio.run(asyncio.wait_for(replica.apply(msgs), 5))
    assert [type(r).__name__ for r in store.applied] == ["IndexedChunk", "IndexedChunk",
                                                         "IndexedDoc"]
    (letter,) = [decode(v, DeadLetter) for v in letters.letters]
    assert letter.offset == 99 and letter.error_field == "vector"
    assert "7 values" in letter.reason and "4-dimensional" in letter.reason
    assert store.offsets == {0: 100} and p.stats["replica_refused"] == 1
