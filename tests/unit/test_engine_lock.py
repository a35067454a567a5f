"""The worker's engine lock: a request waits for the pass running when it came, never for
the warmups queued behind it (`workers.engine_lock`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from workers.engine_lock import EngineLock


def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.001)


def test_a_request_goes_before_the_rest_of_a_warmup_burst() -> None:
    lock, order = EngineLock(), []
    running, finish_first = threading.Event(), threading.Event()

    def burst() -> None:  # the command thread: prefills back to back
        for i in range(3):
            with lock.background():
                order.append(f"warmup{i}")
                if i == 0:
                    running.set()
                    finish_first.wait(5)

    def request() -> None:
        with lock.serving():
            order.append("request")

    warmups = threading.Thread(target=burst)
    warmups.start()
    running.wait(5)
    asker = threading.Thread(target=request)
    asker.start()
    _until(lambda: lock.waiting_requests == 1)
    finish_first.set()  # the running prefill ends; a plain Lock gave the burst the engine
    for t in (warmups, asker):
        t.join(5)
    assert order == ["warmup0", "request", "warmup1", "warmup2"]


def test_background_work_waits_while_a_request_holds_the_engine() -> None:
    lock = EngineLock()
    with lock.serving() as waited:
        assert waited >= 0.0
        assert not lock.try_background(0.01)  # TTL expiry skips a busy engine
    assert lock.try_background(0.01)
    held = lock.serving()  # entered in another thread, left here
    got: list[float] = []
    asker = threading.Thread(target=lambda: got.append(held.__enter__()))
    asker.start()
    _until(lambda: lock.waiting_requests == 1)
    lock.release()
    asker.join(5)
    assert len(got) == 1 and got[0] > 0.0  # it waited for the background work, then held it
    assert not lock.try_background(0.01)
    held.__exit__(None, None, None)
    assert lock.try_background(0.01)
    lock.release()


def test_requests_exclude_each_other() -> None:
    lock, inside, most = EngineLock(), [0], [0]

    def request() -> None:
        for _ in range(50):
            with lock.serving():
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                time.sleep(0.0001)
                inside[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 1


def test_a_warmup_yields_between_passes_only_to_a_waiting_request() -> None:
    lock, order = EngineLock(), []
    with lock.serving():
        assert lock.yield_to_requests() == 0.0  # a request's own passes never yield
    with lock.background():
        assert lock.yield_to_requests() == 0.0  # nobody waits: the next pass runs at once

        def request() -> None:
            with lock.serving():
                order.append("request")

        asker = threading.Thread(target=request)
        asker.start()
        _until(lambda: lock.waiting_requests == 1)
        order.append("pass 1")
        given = lock.yield_to_requests()
        order.append("pass 2")  # the engine is the warmup's again
        assert not lock.try_background(0.01)
        asker.join(5)
    assert order == ["pass 1", "request", "pass 2"] and given > 0.0
    assert lock.try_background(0.01)


def _back_to_back(lock: EngineLock, stop: threading.Event) -> list[threading.Thread]:
    """Two clients sending requests back to back: whenever one ends, the other waits."""

    def client() -> None:
        while not stop.is_set():
            with lock.serving():
                time.sleep(0.002)

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    _until(lambda: lock.waiting_requests >= 1)
    return threads


def test_background_work_gets_a_turn_once_it_waited_the_bound() -> None:
    overdue: list[int] = []
    lock = EngineLock(0.05, on_overdue=overdue.append)
    stop = threading.Event()
    clients = _back_to_back(lock, stop)
    try:
        started = time.monotonic()
        assert lock.try_background(2.0)  # unbounded, it waits for a gap that never comes
        waited = time.monotonic() - started
        assert lock.waiting_requests >= 1  # taken ahead of a waiting request
        lock.release()
        assert waited >= 0.05 and overdue and overdue[0] >= 1
        # A warmup's later passes get the same bound, not a free run.
        assert lock.try_background(None)
        overdue.clear()
        assert lock.yield_to_requests() >= 0.05
        assert overdue
        lock.release()
    finally:
        stop.set()
        for t in clients:
            t.join(5)


def test_without_a_bound_background_work_waits_for_a_gap() -> None:
    lock, stop = EngineLock(None), threading.Event()
    clients = _back_to_back(lock, stop)
    try:
        assert not lock.try_background(0.2)  # TTL expiry skips its turn
    finally:
        stop.set()
        for t in clients:
            t.join(5)
    assert lock.try_background(0.5)  # the requests stopped: a gap
    lock.release()


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_background_wait_s"):
        EngineLock(0.0)


def test_waiting_requests_take_the_engine_in_the_order_they_came() -> None:
    lock, order = EngineLock(), []
    assert lock.try_background(1.0)  # the engine is busy while they queue up

    def request(name: str) -> None:
        with lock.serving():
            order.append(name)

    askers = []
    for i in range(5):
        askers.append(threading.Thread(target=request, args=(f"r{i}",)))
        askers[-1].start()
        _until(lambda n=i: lock.waiting_requests == n + 1)
    lock.release()
    for t in askers:
        t.join(5)
    assert order == [f"r{i}" for i in range(5)]
