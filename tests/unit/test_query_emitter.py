"""The query-event buffer: emit never blocks, an outage loses nothing up to the bound."""

from __future__ import annotations

import threading
import time

from ragwarm.client.emitter import QueryEmitter
from schemas import QueryEvent


class Delivery:
    def __init__(self) -> None:
        self.errbacks: list = []

    def add_errback(self, fn, *args) -> None:
        self.errbacks.append((fn, args))

    def fail(self, exc: Exception) -> None:
        for fn, args in self.errbacks:
            fn(*args, exc)


class Producer:
    """Stands in for kafka-python's producer: refuses sends while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[bytes] = []
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()

    def send(self, topic, key, value) -> Delivery:
        if self.down:
            raise TimeoutError("no metadata for rag.queries")
        with self.lock:
            self.sent.append(value)
            self.deliveries.append(Delivery())
            return self.deliveries[-1]

    def flush(self, timeout=None) -> None: ...

    def close(self, timeout=None) -> None: ...


def event(n: int) -> QueryEvent:
    return QueryEvent(tenant="t", question=f"question {n}", qid=f"q{n}", prompt_tokens=1,
                      ttft_ms=1.0)


def wait_for(check, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_events_sent_during_an_outage_are_sent_when_it_ends() -> None:
    producer = Producer()
    producer.down = True
    emitter = QueryEmitter(producer, "rag.queries", retry_s=0.02)
    started = time.monotonic()
    for n in range(5):
        emitter.emit(event(n))
    assert time.monotonic() - started < 0.5  # the answers never wait on Kafka
    wait_for(lambda: emitter.errors > 0)
    assert producer.sent == []
    producer.down = False
    wait_for(lambda: len(producer.sent) == 5)
    assert emitter.dropped == 0 and emitter.buffered == 0
    emitter.close()


def test_a_failed_delivery_goes_back_to_the_buffer() -> None:
    producer = Producer()
    emitter = QueryEmitter(producer, "rag.queries", retry_s=0.02)
    emitter.emit(event(1))
    wait_for(lambda: len(producer.sent) == 1)
    producer.deliveries[0].fail(TimeoutError("expired in the accumulator"))
    wait_for(lambda: len(producer.sent) == 2)
    assert producer.sent[0] == producer.sent[1] and emitter.errors == 1
    emitter.close()


def test_beyond_the_bound_the_oldest_are_dropped_and_counted() -> None:
    producer = Producer()
    producer.down = True
    emitter = QueryEmitter(producer, "rag.queries", max_buffered=3, retry_s=10)
    for n in range(6):
        emitter.emit(event(n))
    wait_for(lambda: emitter.dropped == 3)
    producer.down = False
    emitter.close(timeout_s=2)
    sent = sorted(QueryEvent.model_validate_json(v).qid for v in producer.sent)
    assert sent == ["q3", "q4", "q5"]
