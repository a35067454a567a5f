"""Building a dead letter: what every consumer of an input topic sends to `ragwarm.deadletter`
for a record it refuses (the streams app for its topics, a worker for `warmup.commands`).

Pure: the callers send the letter with their own producer.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from schemas.events import DeadLetter

# Bytes of a dead letter besides the payload: the key, reason and fields, with room.
ENVELOPE_BYTES = 16 * 1024
# Each text field of a letter is cut to these bytes as JSON (a control character escapes
# to 6 bytes, so a bound in characters would not bound the letter): with the key's base64
# (MAX_REASON raw bytes: 5.5 KB) about 11.5 KB, inside ENVELOPE_BYTES.
MAX_REASON = 4096
NOTES_BYTES = 256  # of MAX_REASON: what was cut, and from how many bytes
MAX_FIELD = 1024
MAX_TOPIC = 1024
# Defaults of the size limits (the streams app's settings; a worker uses them as they are):
# payload bytes a letter carries, and the producer's max request size it must fit.
PAYLOAD_BYTES = 256 * 1024
MAX_REQUEST_BYTES = 1_000_000


@dataclass(frozen=True)
class Origin:
    """Where a record came from: what a dead letter must name to find the original."""

    topic: str
    partition: int | None
    offset: int | None
    key: bytes | None
    value: bytes | None


def dead_letter(
    origin: Origin, reason: str, field: str | None, max_value_bytes: int
) -> DeadLetter:
    """The dead letter of `origin`. A payload over `max_value_bytes` keeps only its head,
    with the original's size and sha256; the original stays in its topic at its offset."""
    value = origin.value or b""
    head = value[:max_value_bytes]
    key = (origin.key or b"")[:MAX_REASON]
    truncated = len(head) < len(value)
    # The notes go after the reason cut to its share, so that a cut never loses them.
    reason, reason_bytes = clip(reason, MAX_REASON - NOTES_BYTES)
    notes = [] if reason_bytes is None else [f"reason of {reason_bytes} bytes truncated"]
    if truncated:
        notes.append(f"payload of {len(value)} bytes truncated to {len(head)}")
    error_field, field_bytes = clip(field, MAX_FIELD) if field is not None else (None, None)
    if field_bytes is not None:
        # The offending field's name itself can be the bad input (a 900 KB metadata key).
        notes.append(f"error_field of {field_bytes} bytes truncated")
    reason += "".join(f" ({note})" for note in notes)
    return DeadLetter(
        source_topic=clip(origin.topic, MAX_TOPIC)[0] or "?",
        partition=origin.partition,
        offset=origin.offset,
        key_b64=base64.b64encode(key).decode() if origin.key else None,
        value_b64=base64.b64encode(head).decode(),
        value_bytes=len(value),
        value_sha256=hashlib.sha256(value).hexdigest(),
        truncated=truncated,
        reason=reason,
        error_field=error_field,
    )


def clip(text: str, max_bytes: int) -> tuple[str, int | None]:
    """`text` cut so that it takes at most `max_bytes` as JSON in UTF-8, and the bytes it
    took before when it was cut (None: it fits as it is)."""
    size = _json_bytes(text)
    if size <= max_bytes:
        return text, None
    kept, used = [], 0
    for char in text[:max_bytes]:
        used += _json_bytes(char)
        if used > max_bytes:
            break
        kept.append(char)
    return "".join(kept), size


def _json_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


def letter_key(origin: Origin) -> bytes | None:
    """The key a dead letter is sent with: the original's (cut to a bound), None if empty."""
    return (origin.key or b"")[:MAX_REASON] or None


def value_limit(max_request_bytes: int = MAX_REQUEST_BYTES, setting: int = PAYLOAD_BYTES) -> int:
    """Payload bytes a dead letter may carry: base64 grows it by 4/3 and the envelope must
    fit too, so the letter stays under the producer's max request size."""
    fits = (max_request_bytes - ENVELOPE_BYTES) * 3 // 4
    return max(0, min(setting, fits))
