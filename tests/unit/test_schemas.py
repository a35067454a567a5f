"""Schema round trips, rejection of bad input with a named field, and JSON Schema drift."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import (
    MAX_TEXT_BYTES,
    ChunkRef,
    DeadLetter,
    KbChange,
    QueryEvent,
    SchemaError,
    WarmupCommand,
    WorkerEvent,
    decode,
    encode,
)
from schemas.events import EVENT_TYPES
from schemas.generate import render, schema_file

ids = st.text(min_size=1, max_size=40)
hashes = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
refs = st.builds(ChunkRef, chunk_id=ids, content_hash=hashes)

kb_changes = st.one_of(
    st.builds(
        KbChange,
        op=st.just("upsert"),
        doc_id=ids,
        version=st.integers(0, 2**40),
        text=st.text(max_size=200),
        timestamp=times,
        tenant=st.text(min_size=1, max_size=40).filter(lambda t: "\x1f" not in t),
    ),
    st.builds(
        KbChange, op=st.just("delete"), doc_id=ids, version=st.integers(0, 2**40), timestamp=times
    ),
)
queries = st.builds(
    QueryEvent,
    question=st.text(min_size=1, max_size=100),
    chunk_refs=st.lists(refs, max_size=3),
    prefix_hash=st.none() | hashes,
    block_hashes=st.lists(hashes, max_size=5),
    ttft_ms=st.none() | st.floats(0, 1e6),
    timestamp=times,
)
commands = st.builds(
    WarmupCommand,
    command_id=ids,
    op=st.just("prefill"),
    token_ids=st.lists(st.integers(0, 50_000), min_size=1, max_size=50),
    chunk_refs=st.lists(refs, max_size=3),
    timestamp=times,
)
worker_events = st.builds(
    WorkerEvent,
    worker_id=ids,
    kind=st.sampled_from(["stored", "heartbeat", "ready"]),
    mem_used_bytes=st.integers(0, 2**40),
    timestamp=times,
)
dead_letters = st.builds(
    DeadLetter,
    source_topic=ids,
    value_b64=st.text(max_size=20),
    reason=st.text(max_size=50),
    timestamp=times,
)
any_event = st.one_of(kb_changes, queries, commands, worker_events, dead_letters)


@given(any_event)
def test_round_trip(event):
    assert decode(encode(event)) == event
    assert decode(encode(event), type(event)) == event


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_a_named_error(data):
    with pytest.raises(SchemaError) as info:
        decode(data)
    assert info.value.field


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(any_event, st.text(min_size=1, max_size=20), json_values)
def test_corrupted_field_is_named(event, field, value):
    obj = json.loads(encode(event))
    target = field if field in obj else sorted(obj)[len(field) % len(obj)]
    obj[target] = value
    try:
        decoded = decode(json.dumps(obj).encode())
    except SchemaError as exc:
        assert exc.field
        assert exc.field.split(".")[0] in obj or exc.field in (
            "<record>",
            "text",
            "token_ids",
            "chunk_refs",
            "prefix_hash",
        )
    else:
        assert decoded.schema_name == obj["schema_name"]


def _kb(**overrides):
    base = {
        "schema_name": "kb_change",
        "schema_version": 1,
        "op": "upsert",
        "doc_id": "a.md",
        "version": 1,
        "text": "hello",
    }
    base.update(overrides)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (_kb(version="x"), "version"),
        (_kb(op="rename"), "op"),
        (_kb(text=None), "text"),
        (_kb(op="delete"), "text"),
        (_kb(doc_id=""), "doc_id"),
        (_kb(text="x" * (MAX_TEXT_BYTES + 1)), "text"),
        (_kb(schema_name="nope"), "schema_name"),
        (_kb(schema_version=9), "schema_version"),
        (_kb(extra_field=1), "extra_field"),
        (b'{"schema_name": "kb_change", "op": "upsert", "doc_id": "\xff"}', "<record>"),
        (b"[1, 2]", "<record>"),
        (b"not json", "<record>"),
    ],
)
def test_bad_kb_change_names_field(record, field):
    with pytest.raises(SchemaError) as info:
        decode(record)
    assert info.value.field == field


def test_missing_field_is_named():
    record = json.dumps({"schema_name": "kb_change", "op": "upsert", "text": "t", "version": 1})
    with pytest.raises(SchemaError) as info:
        decode(record.encode())
    assert info.value.field == "doc_id"


def test_expected_type_is_enforced():
    event = QueryEvent(question="why?")
    with pytest.raises(SchemaError, match="expected 'kb_change'"):
        decode(encode(event), KbChange)


def test_warmup_command_fields_follow_op():
    with pytest.raises(ValueError, match="token_ids"):
        WarmupCommand(command_id="c", op="prefill")
    with pytest.raises(ValueError, match="prefix_hash"):
        WarmupCommand(command_id="c", op="extend_ttl")


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.SCHEMA)
def test_json_schema_files_match_models(model):
    path = schema_file(model)
    assert path.exists(), f"{path} missing: run `python -m schemas.generate`"
    assert path.read_text() == render(model), f"{path} drifted: run `python -m schemas.generate`"


def test_no_pickle_in_project():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = [
        str(p)
        for pkg in ("ragwarm", "schemas", "rag", "streams", "workers")
        for p in (root / pkg).rglob("*.py")
        if "import pickle" in p.read_text() or "pickle.load" in p.read_text()
    ]
    assert offenders == []


@pytest.mark.parametrize("depth", [65, 500, 950, 100_000])
def test_deep_json_is_refused_the_same_way_at_any_stack_depth(depth):
    # Found by the topic fuzz: 1,000 levels parsed in a main thread but not in a worker's
    # consumer thread, so the same record was refused for two different reasons.
    record = {"schema_name": "kb_change", "op": "delete", "doc_id": "d", "version": 1}
    raw = json.dumps({**record, "metadata": None}).replace("null", "[" * depth + "]" * depth)

    def refuse(stack_left: int) -> str:
        if stack_left:
            return refuse(stack_left - 1)
        with pytest.raises(SchemaError) as refused:
            decode(raw.encode(), KbChange)
        return str(refused.value)

    shallow, deep = refuse(0), refuse(400)
    assert shallow == deep == "<record>: JSON nested deeper than 64 levels"


def test_json_of_64_levels_is_read():
    nested = json.loads("[" * 62 + "]" * 62)  # in the record and metadata: 64 levels
    with pytest.raises(SchemaError, match="metadata"):  # a list is no metadata value
        decode(json.dumps({"schema_name": "kb_change", "op": "delete", "doc_id": "d",
                           "version": 1, "metadata": {"k": nested}}), KbChange)  # fmt: skip
