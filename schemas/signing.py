"""HMAC signatures on the wire: worker events (who may tell the streams app where a worker
is) and warmup commands (who may make a worker prefill, pin, invalidate or synthesize).

Keys (issue 41): the streams app holds one master secret. Each worker signs its events with
its own key, `derive_worker_key(master, worker_id)`, so a worker cannot sign as another;
the app derives the key of the worker an event names to verify it. Commands are signed by the
app with `derive_commands_key(master)` and verified by every worker with that key. The
standard library has no asymmetric signature (and `cryptography` is not a dependency), so
the commands key is shared by the workers: a worker's host, once taken, can forge commands to
the others, though no longer events. Every derived key is the hex text of an HMAC-SHA256, and
is used as the UTF-8 bytes of that text, so an operator can pass it in an environment variable.
"""

from __future__ import annotations

import hashlib
import hmac

from schemas.codec import encode
from schemas.events import WorkerEvent

# The Kafka record header carrying a command's signature (hex), so the command schema stays.
COMMAND_SIGNATURE_HEADER = "ragwarm-signature"
_WORKER_LABEL = b"ragwarm-worker-events:"
_COMMANDS_LABEL = b"ragwarm-warmup-commands"
_COMMAND_CONTEXT = b"ragwarm-warmup-command-v1\x00"


def _hex_mac(key: bytes, payload: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def derive_worker_key(master: bytes, worker_id: str) -> str:
    """The key the worker `worker_id` signs its events with: HMAC-SHA256(master,
    "ragwarm-worker-events:" + worker_id), in hex. Pure: the app and the operator's CLI agree."""
    # surrogatepass: a decoded id may hold a lone surrogate; it still gets a key of its own.
    return _hex_mac(master, _WORKER_LABEL + worker_id.encode("utf-8", "surrogatepass"))


def derive_commands_key(master: bytes) -> str:
    """The key warmup commands are signed with (by the app) and verified with (by workers)."""
    return _hex_mac(master, _COMMANDS_LABEL)


def _mac(event: WorkerEvent, secret: bytes) -> str:
    # The record as it would be without its signature: canonical pydantic JSON.
    unsigned = encode(event.model_copy(update={"signature": None}))
    return _hex_mac(secret, unsigned)


def sign(event: WorkerEvent, secret: bytes) -> WorkerEvent:
    """`event` carrying an HMAC-SHA256 of its record under `secret` (the worker's key)."""
    return event.model_copy(update={"signature": _mac(event, secret)})


def authentic(event: WorkerEvent, secret: bytes) -> bool:
    """Whether `event` was signed with `secret` and not changed since (constant time)."""
    return event.signature is not None and hmac.compare_digest(
        event.signature, _mac(event, secret)
    )


def authentic_under_master(event: WorkerEvent, master: str) -> bool:
    """Whether `event` was signed with the key of the worker it names, derived from `master`:
    a worker holding only its own key cannot sign as another."""
    return authentic(event, derive_worker_key(master.encode(), event.worker_id).encode())


def command_signature(value: bytes, key: bytes) -> bytes:
    """The header value signing one `warmup.commands` record value (hex, ASCII)."""
    return _hex_mac(key, _COMMAND_CONTEXT + value).encode()


def command_authentic(value: bytes, signature: bytes | None, key: bytes) -> bool:
    """Whether `signature` (the header's value) signs exactly `value` under `key`."""
    return signature is not None and hmac.compare_digest(
        signature, command_signature(value, key)
    )


def header(headers: object, name: str) -> bytes | None:
    """The value of the first header called `name` in a Kafka record's (name, value) pairs;
    None when absent or not bytes (anyone can write headers: nothing about them is trusted)."""
    if not isinstance(headers, list | tuple):
        return None
    for item in headers:
        if isinstance(item, tuple) and len(item) == 2 and item[0] == name:
            return item[1] if isinstance(item[1], bytes) else None
    return None
