"""Bad `rag.chunks` records (issue 41): what the index replica must dead-letter, each with
the reason it gives, and never stop for. Values drawn by `tests.fuzz_records` over the
IndexedChunk and IndexedDoc schemas (each sent under the key of the record it mutates),
keys that do not name their record, tombstones without a version, and valid chunks whose
vector has another size than the collection's (an instance running another embedder).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from schemas import IndexedChunk, IndexedDoc, SchemaError, encode
from schemas.chunks import decode_record
from schemas.events import VERSION_HEADER, pack_vector
from schemas.topics import chunk_key, chunk_partition_key, indexed_doc_key
from tests.fuzz_records import VALID, bad_records

Why = tuple[str, str | None]  # the replica's reason (its start) and field


@dataclass(frozen=True)
class ChunkRecord:
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    why: Why | None = None  # None: a valid record, to be applied
    partition_key: bytes | None = None  # a valid record's: its document's partition


def replica_refusal(key: bytes, value: bytes | None,
                    headers: tuple[tuple[str, bytes], ...] = ()) -> Why | None:
    """What the replica's decoder refuses the record with; None if it decodes."""
    try:
        decode_record(key, value, list(headers))
    except SchemaError as exc:
        return str(exc), exc.field
    return None


def _wrong_size(i: int, dim: int) -> ChunkRecord:
    size = [4, dim + 1, dim - 1, 8192, 1][i % 5]
    chunk = VALID[IndexedChunk].model_copy(update={
        "doc_id": f"w{i}.md", "vector_b64": pack_vector([0.25] * size)})
    return ChunkRecord(chunk_key("t", chunk.chunk_id), encode(chunk),
                       why=(f"vector: {size} values", "vector"))


def _bad_key(i: int, rng: random.Random) -> ChunkRecord:
    chunk, doc = VALID[IndexedChunk], VALID[IndexedDoc]
    junk = rng.randbytes(rng.randint(1, 40))
    options: list[tuple[bytes, bytes | None, tuple[tuple[str, bytes], ...]]] = [
        (junk, encode(chunk), ()),
        (b'["chunk","t"]', encode(chunk), ()),
        (json.dumps(["chunk", "t", f"other{i}#0"]).encode(), encode(chunk), ()),
        (json.dumps(["chunk", "u", chunk.chunk_id]).encode(), encode(chunk), ()),
        (indexed_doc_key("t", chunk.doc_id), encode(chunk), ()),
        (chunk_key("t", chunk.chunk_id), encode(doc), ()),
        (indexed_doc_key("t", f"d{i}"), None, ()),
        (chunk_key("t", f"d{i}#0"), None, ()),
        (chunk_key("t", f"d{i}#0"), None, ((VERSION_HEADER, b"x1"),)),
        (chunk_key("t", f"d{i}#0"), None, ((VERSION_HEADER, b"9" * 20),)),
        (chunk_key("t", f"no-ordinal{i}"), None, ((VERSION_HEADER, b"1"),)),
        (json.dumps(["doc", "", "d"]).encode(), encode(doc), ()),
    ]
    key, value, headers = options[i % len(options)]
    why = replica_refusal(key, value, headers)
    assert why is not None, (key, value, headers)
    return ChunkRecord(key, value, headers, why)


def bad_chunk_records(n: int, seed: int, dim: int, max_value: int) -> list[ChunkRecord]:
    """`n` records the replica must dead-letter: half mutated chunks, a quarter mutated
    commits, an eighth bad keys or tombstones, an eighth vectors of another size. A value
    over `max_value` (the producer's limit) is cut there, which leaves it bad."""
    rng = random.Random(seed)
    chunk_key_ = chunk_key("t", VALID[IndexedChunk].chunk_id)
    doc_key_ = indexed_doc_key("t", VALID[IndexedDoc].doc_id)
    out: list[ChunkRecord] = []
    for model, key, share in ((IndexedChunk, chunk_key_, n // 2), (IndexedDoc, doc_key_, n // 4)):
        for _, raw, _ in bad_records(model, share, seed + len(out)):
            raw = raw[:max_value]
            why = replica_refusal(key, raw)
            if why is None:  # a mutation the decoder takes: a chunk of another vector size
                assert model is IndexedChunk
                why = ("vector: ", "vector")
            out.append(ChunkRecord(key, raw, why=why))
    keys = (n - len(out)) // 2
    out += [_bad_key(i, rng) for i in range(keys)]
    out += [_wrong_size(i, dim) for i in range(n - len(out))]
    rng.shuffle(out)
    return out


def valid_chunk_records(tenant: str, docs: int, dim: int) -> list[ChunkRecord]:
    """Documents of two chunks each, then their commit: what an owner publishes."""
    rng = random.Random(7)
    out: list[ChunkRecord] = []
    for d in range(docs):
        doc_id = f"ferry{d}.md"
        part = chunk_partition_key(tenant, doc_id)
        for ordinal in range(2):
            text = f"Ferry {d} part {ordinal}: it leaves pier {d + 3} at {ordinal + 6} o'clock."
            vector = [rng.uniform(-1, 1) for _ in range(dim)]
            chunk = IndexedChunk(tenant=tenant, doc_id=doc_id, ordinal=ordinal,
                                 content_hash=f"{d:02x}{ordinal:02x}" * 16, text=text,
                                 tokens=20, version=1, vector_b64=pack_vector(vector))
            out.append(ChunkRecord(chunk_key(tenant, chunk.chunk_id), encode(chunk),
                                   partition_key=part))
        commit = IndexedDoc(tenant=tenant, doc_id=doc_id, version=1, slots=2)
        out.append(ChunkRecord(indexed_doc_key(tenant, doc_id), encode(commit),
                               partition_key=part))
    return out
