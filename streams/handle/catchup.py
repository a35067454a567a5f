"""When the index replica's catch-up can be reused: once per batch or tick, not per check.

A check (is this ref current? what does this question retrieve?) must see every chunk that
was published before the input that led to it (an op another instance sent after its edit's
chunks were acknowledged). A catch-up reads rag.chunks' end offsets and applies up to them,
so it covers every input that had arrived before that read began. The agents and timers say
when their inputs arrived (`inputs_from`: a batch is all fetched when it is handed over, a
tick's inputs are the tables and windows as the tick starts); a check whose inputs arrived
before the last catch-up began reuses it instead of asking the broker again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Per task (each agent and timer runs in its own): when the inputs being handled arrived,
# on the replica's clock (time.monotonic). Unset: just now, so the check catches up itself.
_arrived: ContextVar[float | None] = ContextVar("ragwarm_inputs_arrived", default=None)


def arrived() -> float | None:
    """When the inputs being handled in this task arrived (None: not said, catch up)."""
    return _arrived.get()


@contextmanager
def inputs_from(at: float) -> Iterator[None]:
    """Handle inputs that had all arrived by `at` (time.monotonic) inside this block."""
    token = _arrived.set(at)
    try:
        yield
    finally:
        _arrived.reset(token)


def covers(caught_up_from: float | None, arrived_at: float | None) -> bool:
    """Whether a catch-up that began at `caught_up_from` covers inputs that arrived at
    `arrived_at`: it began after they were all there (so did their chunks' records)."""
    return caught_up_from is not None and arrived_at is not None and arrived_at <= caught_up_from
