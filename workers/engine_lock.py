"""The engine's lock, requests first: warmup work never makes a waiting request wait longer
than the forward pass running when it came.

A worker runs one forward pass at a time. Its command thread prefills the streams app's
warmups back to back (an edit re-warms several prefixes at once), and a plain
`threading.Lock` is not fair: the thread that releases it may take it again before a woken
waiter runs, and a whole prefill runs under it. So a request that arrived during a burst
waited for the rest of the running prefill and sometimes for the next ones too. Here
background work (warmup commands, TTL expiry) takes the engine only while no request is
waiting for it, and a warmup prefill gives the engine up between its forward passes
(`yield_to_requests`; the torch engine runs a long prompt in passes of
`prefill_chunk_tokens`), as vLLM's chunked prefill lets waiting requests in between a long
prompt's chunks. A pass already running is not cut short.

`ragwarm bench contention` (docs/lab/benchmarks-notebook.md): a 190 ms request arriving during four
1,024-token warmups on 2 CPU cores took 2.0 s (median; 3.6 s at most) under a plain lock
and 0.8 s (0.9 s at most) under this one.

Requests first, but not forever: background work that has waited `max_background_wait_s`
takes the engine ahead of the requests waiting then, for one turn (one pass of a prefill,
or one command). Without that bound a worker under back-to-back requests ran no warmup,
invalidation or TTL expiry at all, and its command consumer stalled with everything
queued behind the one waiting command.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

Work = Literal["request", "background"]

# Long enough that a request rarely waits for more than the pass running when it came
# (a CPU pass of 512 tokens is ~0.3 s here), short enough that warmups under a steady
# stream of requests still move: at most one background turn per this many seconds.
DEFAULT_BACKGROUND_MAX_WAIT_S = 2.0


class EngineLock:
    """Mutual exclusion over the engine with two classes of work: requests (`serving`)
    and background work (`background`). Requests take turns in the order they came (a
    client sending back to back would otherwise take the engine again before a woken
    waiter ran: `ragwarm bench contention --clients 2` saw one request wait 30 s);
    background work yields to every waiting request until it has waited
    `max_background_wait_s` (None: without bound), then goes first for one turn
    (`on_overdue` gets the number of requests it went ahead of)."""

    def __init__(
        self,
        max_background_wait_s: float | None = DEFAULT_BACKGROUND_MAX_WAIT_S,
        on_overdue: Callable[[int], None] | None = None,
    ) -> None:
        if max_background_wait_s is not None and max_background_wait_s <= 0:
            raise ValueError(f"max_background_wait_s must be > 0, got {max_background_wait_s}")
        self._cond = threading.Condition(threading.Lock())
        self._holder: Work | None = None
        self._queue: deque[int] = deque()  # waiting requests' tickets, oldest first
        self._tickets = itertools.count()
        self._overdue = 0  # background waiters past the bound: requests let them go first
        self.max_background_wait_s = max_background_wait_s
        self._on_overdue = on_overdue

    @contextmanager
    def serving(self) -> Iterator[float]:
        """Hold the engine for a request; yields the seconds it waited."""
        started = time.perf_counter()
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            try:
                self._cond.wait_for(
                    lambda: self._holder is None and not self._overdue and self._queue[0] == ticket
                )
            except BaseException:  # interrupted: the ticket behind this one may go now
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise
            # Its ticket is at the head. The next one cannot go before `release`, which
            # wakes every waiter anyway: no notify here.
            self._queue.popleft()
            self._holder = "request"
        try:
            yield time.perf_counter() - started
        finally:
            self.release()

    @contextmanager
    def background(self) -> Iterator[float]:
        """Hold the engine for background work once no request waits; yields the wait."""
        started = time.perf_counter()
        self.try_background(None)
        try:
            yield time.perf_counter() - started
        finally:
            self.release()

    def try_background(self, timeout_s: float | None) -> bool:
        """Take the engine for background work within `timeout_s` (None: however long it
        takes; False: still busy); the caller releases it with `release`."""
        with self._cond:
            return self._take_background(timeout_s)

    def release(self) -> None:
        with self._cond:
            self._holder = None
            # Every waiter re-checks: a request takes it, background waiters keep waiting
            # (one past the bound goes first).
            self._cond.notify_all()

    @property
    def waiting_requests(self) -> int:
        """Requests waiting for the engine now."""
        with self._cond:
            return len(self._queue)

    def yield_to_requests(self) -> float:
        """Between two passes of background work holding the engine: when requests wait,
        let them go first (all of them, within `max_background_wait_s`), then take the
        engine back; the seconds given away.
        A no-op for a request's own passes. So a request waits for one pass of a warmup
        (`prefill_chunk_tokens`), not for the whole prompt."""
        with self._cond:
            if self._holder != "background" or not self._queue:
                return 0.0
            started = time.perf_counter()
            self._holder = None
            self._cond.notify_all()
            self._take_background(None)
            return time.perf_counter() - started

    def _take_background(self, timeout_s: float | None) -> bool:
        """With `_cond` held: wait until no request waits, or until this wait passes the
        bound and the engine is free, then hold it for background work; False when
        `timeout_s` ran out first."""
        now = time.monotonic()
        end = None if timeout_s is None else now + timeout_s
        bound = self.max_background_wait_s
        overdue_at = None if bound is None else now + bound
        overdue = False
        try:
            while True:
                if self._holder is None and (overdue or not self._queue):
                    if self._queue and self._on_overdue is not None:
                        self._on_overdue(len(self._queue))  # under the lock: be brief
                    self._holder = "background"
                    return True
                now = time.monotonic()
                if end is not None and now >= end:
                    return False
                if overdue_at is not None and now >= overdue_at and not overdue:
                    overdue = True
                    self._overdue += 1
                    continue
                wakes = [t - now for t in (end, None if overdue else overdue_at) if t is not None]
                self._cond.wait(min(wakes) if wakes else None)
        finally:
            if overdue:
                self._overdue -= 1
                self._cond.notify_all()  # requests held back by this waiter re-check
