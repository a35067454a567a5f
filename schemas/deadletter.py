"""Building a dead letter: what every consumer of an input topic sends to `ragwarm.deadletter`
for a record it refuses (the streams app for its topics, a worker for `warmup.commands`).

Pure: the callers send the letter with their own producer.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from schemas.events import DeadLetter

# Bytes of a dead letter besides the payload: the key, reason and fields, with room.
ENVELOPE_BYTES = 16 * 1024
MAX_REASON = 4096
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
    if truncated:
        reason = f"{reason} (payload of {len(value)} bytes truncated to {len(head)})"
    return DeadLetter(
        source_topic=origin.topic,
        partition=origin.partition,
        offset=origin.offset,
        key_b64=base64.b64encode(key).decode() if origin.key else None,
        value_b64=base64.b64encode(head).decode(),
        value_bytes=len(value),
        value_sha256=hashlib.sha256(value).hexdigest(),
        truncated=truncated,
        reason=reason[:MAX_REASON],
        error_field=field,
    )


def letter_key(origin: Origin) -> bytes | None:
    """The key a dead letter is sent with: the original's (cut to a bound), None if empty."""
    return (origin.key or b"")[:MAX_REASON] or None


def value_limit(max_request_bytes: int = MAX_REQUEST_BYTES, setting: int = PAYLOAD_BYTES) -> int:
    """Payload bytes a dead letter may carry: base64 grows it by 4/3 and the envelope must
    fit too, so the letter stays under the producer's max request size."""
    fits = (max_request_bytes - ENVELOPE_BYTES) * 3 // 4
    return max(0, min(setting, fits))
