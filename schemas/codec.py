"""JSON encoding of events, and a decoder that names the offending field on bad input."""

from __future__ import annotations

import json
from typing import TypeVar, overload

from pydantic import ValidationError

from schemas.events import EVENT_TYPES, LEGACY_TYPES, Event

E = TypeVar("E", bound=Event)

# Bounds a single record so a hostile producer cannot make a consumer parse megabytes of JSON.
MAX_RECORD_BYTES = 4_000_000
# Events nest three levels at most. A bound well below the interpreter's recursion limit
# makes deep JSON fail the same way wherever it is decoded: how deep `json.loads` gets
# depends on the caller's stack (a consumer thread has less left than a main thread).
MAX_DEPTH = 64

registry: dict[tuple[str, int], type[Event]] = {
    (t.SCHEMA, t.VERSION): t for t in (*LEGACY_TYPES, *EVENT_TYPES)
}
# The model every version of a schema is read as.
current: dict[str, type[Event]] = {t.SCHEMA: t for t in EVENT_TYPES}


class SchemaError(ValueError):
    """A record that is not a valid event; `field` names what was wrong ('' for the record)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field or '<record>'}: {message}")
        self.field = field or "<record>"
        self.message = message


def encode(event: Event) -> bytes:
    """Serialize an event as compact UTF-8 JSON."""
    return event.model_dump_json(exclude_none=False).encode("utf-8")


@overload
def decode(data: bytes | str, expected: None = None) -> Event: ...


@overload
def decode(data: bytes | str, expected: type[E]) -> E: ...


def decode(data: bytes | str, expected: type[E] | None = None) -> E | Event:
    """Parse and validate one record; raise `SchemaError` naming the field on any problem."""
    obj = _parse(data)
    name = obj.get("schema_name")
    version = obj.get("schema_version", 1)
    if not isinstance(name, str):
        raise SchemaError("schema_name", "missing or not a string")
    if not isinstance(version, int) or isinstance(version, bool):
        raise SchemaError("schema_version", "must be an integer")
    model = registry.get((name, version))
    if model is None:
        known = sorted({n for n, _ in registry})
        if name in known:
            raise SchemaError("schema_version", f"unsupported version {version} of {name!r}")
        raise SchemaError(
            "schema_name", f"unknown schema {_clip(name)!r}; known: {', '.join(known)}"
        )
    if expected is not None and name != expected.SCHEMA:
        raise SchemaError("schema_name", f"expected {expected.SCHEMA!r}, got {name!r}")
    try:
        return upgrade(model.model_validate(obj))
    except ValidationError as exc:
        raise _first_error(exc) from None


def _clip(text: str, keep: int = 80) -> str:
    """Untrusted input quoted in a reason, cut short: a reason is logged, sent back in a
    `refused` event and kept in a dead letter, each with its own size limit."""
    return text if len(text) <= keep else text[:keep] + f"... ({len(text)} chars)"


def upgrade(event: Event) -> Event:
    """An event of an older schema version as the current model (new fields at defaults).

    Versions only add optional fields and widen enums, so an old record always fits.
    """
    latest = current[event.SCHEMA]
    if type(event) is latest:
        return event
    return latest.model_validate(event.model_dump() | {"schema_version": latest.VERSION})


def _parse(data: bytes | str) -> dict:
    if isinstance(data, bytes | bytearray | memoryview):
        if len(data) > MAX_RECORD_BYTES:
            raise SchemaError("", f"record larger than {MAX_RECORD_BYTES} bytes")
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SchemaError("", f"invalid UTF-8 at byte {exc.start}") from None
    elif not isinstance(data, str):
        raise SchemaError("", f"expected bytes or str, got {type(data).__name__}")
    try:
        obj = json.loads(data)
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as exc:
        raise SchemaError("", f"not JSON: {exc}") from None
    # Counting brackets (quoted ones too) is fast and bounds the depth from above.
    if data.count("[") + data.count("{") > MAX_DEPTH and _depth(obj) > MAX_DEPTH:
        raise _too_deep()
    if not isinstance(obj, dict):
        raise SchemaError("", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _too_deep() -> SchemaError:
    return SchemaError("", f"JSON nested deeper than {MAX_DEPTH} levels")


def _depth(obj: object) -> int:
    """Nesting depth of parsed JSON, without recursion (the input may be deep)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, level)
            if deepest > MAX_DEPTH:
                return deepest
            stack.extend((child, level + 1) for child in node if isinstance(child, dict | list))
    return deepest


def _first_error(exc: ValidationError) -> SchemaError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = err.get("msg", "invalid")
    # Model-level validators report their field as the message prefix ("text: ...").
    if not loc and ":" in msg:
        field, _, rest = msg.removeprefix("Value error, ").partition(":")
        return SchemaError(field.strip(), rest.strip())
    return SchemaError(loc, msg)
