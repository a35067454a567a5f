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

`ragwarm bench contention` (docs/benchmarks.md): a 190 ms request arriving during four
1,024-token warmups on 2 CPU cores took 2.0 s (median; 3.6 s at most) under a plain lock
and 0.8 s (0.9 s at most) under this one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

Work = Literal["request", "background"]


class EngineLock:
    """Mutual exclusion over the engine with two classes of work: requests (`serving`)
    and background work (`background`). Requests take turns among themselves in no set
    order; background work yields to every waiting request. So under back-to-back requests
    background work waits for a gap: a saturated worker has no time for warmups, and TTL
    expiry (`try_background`) skips its turn."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holder: Work | None = None
        self._requests_waiting = 0

    @contextmanager
    def serving(self) -> Iterator[float]:
        """Hold the engine for a request; yields the seconds it waited."""
        started = time.perf_counter()
        with self._cond:
            self._requests_waiting += 1
            try:
                self._cond.wait_for(lambda: self._holder is None)
            finally:
                self._requests_waiting -= 1
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
            if not self._cond.wait_for(self._free_for_background, timeout_s):
                return False
            self._holder = "background"
            return True

    def release(self) -> None:
        with self._cond:
            self._holder = None
            # Every waiter re-checks: a request takes it, background waiters keep waiting.
            self._cond.notify_all()

    @property
    def waiting_requests(self) -> int:
        """Requests waiting for the engine now."""
        with self._cond:
            return self._requests_waiting

    def yield_to_requests(self) -> float:
        """Between two passes of background work holding the engine: when requests wait,
        let them (all of them) go first, then take the engine back; the seconds given away.
        A no-op for a request's own passes. So a request waits for one pass of a warmup
        (`prefill_chunk_tokens`), not for the whole prompt."""
        with self._cond:
            if self._holder != "background" or not self._requests_waiting:
                return 0.0
            started = time.perf_counter()
            self._holder = None
            self._cond.notify_all()
            self._cond.wait_for(self._free_for_background)
            self._holder = "background"
            return time.perf_counter() - started

    def _free_for_background(self) -> bool:
        return self._holder is None and not self._requests_waiting
