"""The store's one thread, with the calls an edit waits on ahead of background ones.

Why: Qdrant local mode and the embedder run on one thread (`HandlerDeps.executor`), so a
retrieval an edit's re-warm needs queued behind whatever the hot-token timer and the edit
watch had asked for (a retrieval each, tens of them a tick or an edit): about a second from
an edit's invalidation to its prefill on a loaded machine. Calls made inside `background()`
(the hot tick, the edit watch's re-checks) now wait while other calls are queued; a call
already running is never interrupted, and calls of one priority keep their order.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

URGENT, BACKGROUND, STOP = 0, 1, 2

# Per task (each agent and timer runs in its own): whether its store calls may wait.
_priority: ContextVar[int] = ContextVar("ragwarm_store_priority", default=URGENT)


@contextmanager
def background() -> Iterator[None]:
    """Store calls made inside this block (in this task) yield to the others queued."""
    token = _priority.set(BACKGROUND)
    try:
        yield
    finally:
        _priority.reset(token)


def current() -> int:
    """The priority a store call made now would get (URGENT unless in `background()`)."""
    return _priority.get()


class PriorityExecutor(Executor):
    """One worker thread taking queued calls lowest priority value first, FIFO within one."""

    def __init__(self, name: str = "ragwarm-store") -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._seq = itertools.count()  # ties never compare the payloads
        self._shutdown = False
        register = getattr(threading, "_register_atexit", None)
        self._thread = threading.Thread(target=self._work, name=name, daemon=register is None)
        self._thread.start()
        if register is not None:
            # As concurrent.futures' own pools: at interpreter exit the call running (a store
            # write) and those queued finish before the thread stops; none is cut midway.
            register(self.shutdown)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        future: Future = Future()
        self._queue.put((current(), next(self._seq), (future, fn, args, kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._shutdown:
            self._shutdown = True
            # After every queued call (STOP sorts last), unless they are to be cancelled.
            self._queue.put((-1 if cancel_futures else STOP, next(self._seq), None))
        if wait:
            self._thread.join()

    def _work(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is None:
                self._cancel_rest()
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                future.set_exception(exc)

    def _cancel_rest(self) -> None:
        while True:
            try:
                _, _, item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].cancel()
