"""HMAC signatures of worker events: who may tell the streams app where a worker is."""

from __future__ import annotations

import hashlib
import hmac

from schemas.codec import encode
from schemas.events import WorkerEvent


def _mac(event: WorkerEvent, secret: bytes) -> str:
    # The record as it would be without its signature: canonical pydantic JSON.
    unsigned = encode(event.model_copy(update={"signature": None}))
    return hmac.new(secret, unsigned, hashlib.sha256).hexdigest()


def sign(event: WorkerEvent, secret: bytes) -> WorkerEvent:
    """`event` carrying an HMAC-SHA256 of its record under the shared `secret`."""
    return event.model_copy(update={"signature": _mac(event, secret)})


def authentic(event: WorkerEvent, secret: bytes) -> bool:
    """Whether `event` was signed with `secret` and not changed since (constant time)."""
    return event.signature is not None and hmac.compare_digest(
        event.signature, _mac(event, secret)
    )
