"""How the app tells a bad record from a bad moment: fault classes, backoff, dead letters.

Pure: no Faust, no Kafka. `streams/agents.py` applies these to records and timers.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from schemas import DeadLetter, SchemaError

log = logging.getLogger(__name__)

# Bytes of a dead letter besides the payload: the key, reason and fields, with room.
ENVELOPE_BYTES = 16 * 1024
MAX_REASON = 4096


def is_permanent(exc: BaseException) -> bool:
    """A record that is malformed or invalid fails the same way every time; anything else
    (the store locked or unwritable, the embedder, the broker, a worker) may pass later."""
    return isinstance(exc, SchemaError | ValidationError | UnicodeDecodeError)


def reason_of(exc: BaseException) -> tuple[str, str | None]:
    """A dead letter's reason and the offending field, if the error names one."""
    if isinstance(exc, SchemaError):
        return str(exc), exc.field
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(map(str, err["loc"])) or None
        return f"invalid record: {err['msg']}", loc
    return f"{type(exc).__name__}: {exc}", None


@dataclass(frozen=True)
class Backoff:
    """Bounded exponential backoff: `attempts` retries, waits from `initial_s` up to `max_s`."""

    initial_s: float = 0.5
    max_s: float = 30.0
    attempts: int = 12
    factor: float = 2.0

    def delays(self) -> Iterator[float]:
        for n in range(self.attempts):
            yield min(self.max_s, self.initial_s * self.factor**n)

    @property
    def budget_s(self) -> float:
        return sum(self.delays())


async def retry(
    fn: Callable[[], Awaitable[None]],
    backoff: Backoff,
    on_retry: Callable[[BaseException, int, float], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> BaseException | None:
    """Run `fn` until it succeeds (None), fails permanently, or the budget is spent; the
    error that ended it otherwise. The caller waits meanwhile, so per-key order is kept."""
    delays = backoff.delays()
    while True:
        try:
            await fn()
            return None
        except Exception as exc:  # noqa: BLE001 - classified here, re-raised by none
            if is_permanent(exc):
                return exc
            delay = next(delays, None)
            if delay is None:
                return exc
            on_retry(exc, backoff.attempts, delay)
            await sleep(delay)


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


def value_limit(max_request_bytes: int, setting: int) -> int:
    """Payload bytes a dead letter may carry: base64 grows it by 4/3 and the envelope must
    fit too, so the letter stays under the producer's max request size."""
    fits = (max_request_bytes - ENVELOPE_BYTES) * 3 // 4
    return max(0, min(setting, fits))


def guarded(
    name: str, fn: Callable[[], Awaitable[object]], on_error: Callable[[], None]
) -> Callable[[], Awaitable[None]]:
    """`fn` for a timer or background task: an exception is logged with the task's name
    and counted; the task runs again next time and the app keeps running."""

    async def run() -> None:
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one failed tick must not stop the app
            log.exception("%s failed; it runs again at its next tick", name)
            on_error()

    run.__name__ = run.__qualname__ = name.replace(".", "_").replace("-", "_")
    return run
