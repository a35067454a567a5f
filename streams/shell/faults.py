"""How the app tells a bad record from a bad moment: fault classes and backoff (the dead
letters themselves are built by `schemas.deadletter`, shared with the workers).

Pure: no Faust, no Kafka. `streams/shell/agents.py` applies these to records and timers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError

from schemas import SchemaError

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    on_park: Callable[[int], None] = lambda change: None,
) -> BaseException | None:
    """Run `fn` until it succeeds (None) or fails permanently (that error). A transient
    failure is never given up: past the backoff's `attempts` the record is parked, i.e.
    retried every `max_s` for good, with `on_park(+1)` as it is parked and `on_park(-1)`
    once it passes (a gauge that alerts while it is above 0).

    Why park rather than dead-letter and redrive once the dependency is back: the caller
    waits meanwhile, so per-key order holds and nothing is acked before it is handled; a
    dead letter is acked at once, and a later redrive would replay a KB change behind
    newer ones, with no sure sign that "the dependency is back" (the store, the
    embedder, the broker and a worker fail differently). A transient failure (a full
    disk, a store held by another process) stops every record of the partition alike,
    so waiting costs nothing the dependency did not already stop; the gauge and the
    retries counter say that it is stuck and why (the log names the error)."""
    delays = backoff.delays()
    parked = False
    try:
        while True:
            try:
                await fn()
                return None
            except Exception as exc:  # noqa: BLE001 - classified here, re-raised by none
                if is_permanent(exc):
                    return exc
                delay = next(delays, None)
                if delay is None:
                    delay = backoff.max_s
                    if not parked:
                        parked = True
                        on_park(1)
                on_retry(exc, backoff.attempts, delay)
                await sleep(delay)
    finally:
        if parked:
            on_park(-1)


async def retry_until_done(
    fn: Callable[[], Awaitable[T]],
    backoff: Backoff,
    on_failure: Callable[[Exception, float], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`fn`'s result once it succeeds, however many tries that takes: for work whose loss
    would lose data (a dead letter, a batch whose offset is saved after it) or a loop that
    must keep running. Waits `backoff.initial_s` after the first failure, `factor` times
    more after each next one, at most `backoff.max_s`; `on_failure(error, wait)` logs and
    counts each failure. Cancellation is not a failure: it ends the retries."""
    delay = backoff.initial_s
    while True:
        try:
            return await fn()
        except Exception as exc:  # noqa: BLE001 - every failure is retried; the caller logs it
            on_failure(exc, delay)
            await sleep(delay)
            delay = min(backoff.max_s, delay * backoff.factor)


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
