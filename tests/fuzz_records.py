"""Hypothesis strategies of bad records for every input topic, drawn over the JSON Schemas
in `schemas/json/`: a valid record broken in one way (a required field dropped, a field of
a type or value its schema does not allow, an unknown version or field, invalid UTF-8,
NaN/Infinity, deep nesting, a huge string), or junk (binary, bare JSON values, truncated
text). Shared by the unit fuzz of the decoders and the integration fuzz on the real topics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from schemas import (
    IndexedChunk,
    IndexedDoc,
    KbChange,
    QueryEvent,
    SchemaError,
    WarmupCommand,
    WorkerEvent,
    decode,
    encode,
)
from schemas.events import pack_vector
from schemas.generate import schema_file

# A fixed timestamp: the same bytes on every run.
AT = datetime(2026, 1, 1, tzinfo=UTC)
VALID = {
    KbChange: KbChange(op="upsert", doc_id="d.md", version=3, text="hello", timestamp=AT),
    QueryEvent: QueryEvent(question="why?", prefix_hash="ab" * 16, block_hashes=["ab" * 16],
                           timestamp=AT),
    WarmupCommand: WarmupCommand(command_id="c1", op="prefill", token_ids=[1, 2, 3], ttl_s=60,
                                 timestamp=AT),
    WorkerEvent: WorkerEvent(worker_id="w1", kind="heartbeat", url="http://w1", timestamp=AT),
    IndexedChunk: IndexedChunk(tenant="t", doc_id="d.md", ordinal=0, content_hash="ab" * 32,
                               text="hello", tokens=1, version=3,
                               vector_b64=pack_vector([0.5, -0.5, 0.5, -0.5]), timestamp=AT),
    IndexedDoc: IndexedDoc(tenant="t", doc_id="d.md", version=3, slots=1, timestamp=AT),
}  # fmt: skip
# One value of each JSON type (and the non-JSON NaN/Infinity); `retype` picks one of a type
# the field's schema does not allow.
BY_TYPE: dict[str, list[Any]] = {
    "null": [None],
    "boolean": [True, False],
    "integer": [2**70, -(2**63) - 1, -1, 0],
    "number": [1.5, 1e308, math.nan, math.inf, -math.inf],
    "string": ["", "x", "\ud800", "\x00"],
    "array": [[], [[[[[[1]]]]]], [None]],
    "object": [{}, {"a": 1}],
}
VERSIONS = [0, 6, 99, -1, "2", None, 2**64, 1.5, True]
RAW = [b"\xff\xfe{}", b"null", b"", b"[]", b"{", b'{"schema_name": NaN}', b"\x80abc",
       b'"kb_change"', b"Infinity", b"1e999", b'{"schema_name": "kb_change"']  # fmt: skip
BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xc0\xaf"]
HUGE = [100_000, 100_000, 1_000_001, 4_000_001]  # the last is over schemas.codec.MAX_RECORD_BYTES
# Hypothesis draws the ends of a range more often: the megabyte kinds sit in the middle, so
# they stay rare (each one is a megabyte through the broker in the integration fuzz).
KINDS = (
    ["drop"] * 36 + ["version"] * 16 + ["binary"] * 16 + ["raw"] * 18 + ["utf8"] * 10
    + ["deep", "huge", "deep"] + ["nan"] * 10 + ["extra"] * 16 + ["bound"] * 24 + ["retype"] * 50
)  # fmt: skip
PLACEHOLDER = "\x1fFUZZ\x1f"
BATCH = 20


@cache
def json_schema(model: type) -> dict[str, Any]:
    return json.loads(schema_file(model).read_text())


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a property's schema allows ($ref and anyOf flattened)."""
    if "$ref" in prop:
        return _resolve(defs[prop["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in prop:
        return [alt for sub in prop["anyOf"] for alt in _resolve(sub, defs)]
    return [prop]


def json_types(prop: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    types = {alt.get("type", "any") for alt in _resolve(prop, defs)}
    return types | {"integer"} if "number" in types else types


def out_of_bounds(prop: dict[str, Any], defs: dict[str, Any]) -> list[Any]:
    """Values of an allowed type that break the property's bounds, pattern, enum or const."""
    found: list[Any] = []
    for alt in _resolve(prop, defs):
        if "minimum" in alt:
            found.append(alt["minimum"] - 1)
        if "maximum" in alt:
            found.append(alt["maximum"] + 1)
        if "exclusiveMinimum" in alt:
            found.append(alt["exclusiveMinimum"])
        if alt.get("minLength"):
            found.append("")
        if "maxLength" in alt:
            found.append("x" * (alt["maxLength"] + 1))
        if "maxItems" in alt:
            found.append(["x"] * (alt["maxItems"] + 1))
        if "pattern" in alt or "enum" in alt or "const" in alt:
            found.append("NOT-" + str(alt.get("const", "valid")))
    return found


def of_type(json_type: str) -> st.SearchStrategy[Any]:
    """A value of one JSON type: a listed odd one, or one drawn."""
    drawn = {
        "integer": st.integers(),
        "number": st.floats(allow_nan=True, allow_infinity=True).filter(
            lambda x: not x.is_integer()
        ),
        "string": st.text(max_size=20),
        "array": st.lists(st.integers(), max_size=5),
        "object": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    }.get(json_type, st.nothing())
    return st.one_of(st.sampled_from(BY_TYPE[json_type]), drawn)


class Drawn:
    """A drawn record and its kind; its repr is short (Hypothesis prints examples, and some
    are megabytes; a plain class, as Hypothesis prints a dataclass field by field)."""

    __slots__ = ("kind", "raw")

    def __init__(self, kind: str, raw: bytes) -> None:
        self.kind, self.raw = kind, raw

    def __repr__(self) -> str:
        return f"Drawn({self.kind!r}, {len(self.raw)} bytes: {self.raw[:120]!r})"


@st.composite
def bad_record(draw: st.DrawFn, model: type) -> Drawn:
    return Drawn(*draw(_bad_record(model)))


@st.composite
def _bad_record(draw: st.DrawFn, model: type) -> tuple[str, bytes]:
    """(kind, bytes) of a record that is not a valid `model` event, or rarely one a mutation
    left valid (a value the schema allows after all): callers that need it bad filter."""
    schema = json_schema(model)
    props, defs = schema["properties"], schema.get("$defs", {})
    base = json.loads(encode(VALID[model]))
    how = draw(st.sampled_from(KINDS))
    if how == "drop":
        base.pop(draw(st.sampled_from(["schema_name", *schema.get("required", [])])), None)
    elif how == "retype":
        name = draw(st.sampled_from(sorted(props)))
        allowed = json_types(props[name], defs)
        wrong = [t for t in BY_TYPE if t not in allowed] or ["object"]
        base[name] = draw(st.sampled_from(wrong).flatmap(of_type))
    elif how == "bound":
        bounded = sorted(n for n in props if out_of_bounds(props[n], defs))
        name = draw(st.sampled_from(bounded))
        base[name] = draw(st.sampled_from(out_of_bounds(props[name], defs)))
    elif how == "version":
        base["schema_version"] = draw(st.sampled_from(VERSIONS))
    elif how == "extra":
        base[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in props))] = 1
    elif how == "nan":
        base[draw(st.sampled_from(sorted(props)))] = draw(st.sampled_from(BY_TYPE["number"][2:]))
    elif how == "utf8":
        base[draw(st.sampled_from(sorted(props)))] = PLACEHOLDER
        text = json.dumps(base).encode()
        return how, text.replace(json.dumps(PLACEHOLDER).encode()[1:-1],
                                 draw(st.sampled_from(BAD_UTF8)))  # fmt: skip
    elif how == "raw":
        return how, draw(st.sampled_from(RAW))
    elif how == "binary":
        return how, draw(st.binary(min_size=1, max_size=64))
    elif how == "deep":
        depth = draw(st.sampled_from([1_000, 100_000]))
        if draw(st.booleans()):
            return how, deep(depth).encode()
        base[draw(st.sampled_from(sorted(props)))] = PLACEHOLDER
        return how, json.dumps(base).replace(json.dumps(PLACEHOLDER), deep(depth)).encode()
    else:
        base[draw(st.sampled_from(sorted(props)))] = "x" * draw(st.sampled_from(HUGE))
    return how, json.dumps(base, allow_nan=True, ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def deep(n: int) -> str:
    return "[" * n + "]" * n


def refusal(raw: bytes, model: type) -> tuple[str, str | None] | None:
    """The reason and field `schemas.decode` refuses `raw` with; None if it is valid."""
    try:
        decode(raw, model)
    except SchemaError as exc:
        return str(exc), exc.field
    return None


def bad_records(
    model: type, n: int, at_seed: int, keep: Callable[[bytes], bool] | None = None
) -> list[tuple[str, bytes, tuple[str, str | None]]]:
    """`n` records `schemas.decode` refuses (and `keep` accepts), each with its kind and the
    decoder's (reason, field), drawn by Hypothesis from a fixed seed: the same ones on every
    run (of one Hypothesis version). Drawn `BATCH` to an example: Hypothesis' own work per
    example is most of the time otherwise."""
    found: list[tuple[str, bytes, tuple[str, str | None]]] = []
    while len(found) < n:
        # A run may end early (a mutation that stayed valid is left out): draw on.
        @seed(at_seed + len(found))
        @settings(max_examples=-(-(n - len(found)) // BATCH), database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(st.lists(bad_record(model), min_size=BATCH, max_size=BATCH,
                        unique_by=lambda d: d.raw))  # fmt: skip
        def collect(records: list[Drawn]) -> None:
            for d in records:
                why = refusal(d.raw, model)
                if why is not None and (keep is None or keep(d.raw)):
                    found.append((d.kind, d.raw, why))

        collect()
    return found[:n]
