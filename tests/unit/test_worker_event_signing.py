"""Authentic worker events: only signed events move the worker table, and so routing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas import WorkerEvent, decode, encode
from schemas.signing import authentic, derive_worker_key, sign
from streams.decide.logic import choose_worker
from streams.handle import handlers
from streams.sim import run_sync
from tests.unit.conftest import Port, pipeline

SECRET = b"workers-only"
MASTER = "the-streams-apps-master"


def key_of(worker_id: str) -> bytes:
    """What `ragwarm keys worker-key --worker-id W` prints, as the worker uses it."""
    return derive_worker_key(MASTER.encode(), worker_id).encode()
P1 = "c" * 64


def heartbeat(worker_id: str, url: str, prefixes: list[str]) -> WorkerEvent:
    return WorkerEvent(worker_id=worker_id, kind="heartbeat", url=url, mem_total_bytes=1000,
                       warm_prefixes=prefixes)  # fmt: skip


def route(p: handlers.HandlerDeps) -> str | None:
    live = p.tables.worker_states.values()
    chosen = choose_worker([w for w in live if w.ready and w.url], [P1], threshold=1.0)
    return next((w.url for w in live if w.worker_id == chosen), None)


def test_a_forged_unsigned_heartbeat_changes_no_route() -> None:
    p, _ = pipeline(Port({}), worker_events_secret=MASTER)
    run_sync(handlers.on_worker_event(p, sign(heartbeat("w1", "http://w1:8000", []), key_of("w1"))))
    before = dict(p.tables.workers)
    assert route(p) == "http://w1:8000"
    forged = heartbeat("w1", "http://evil:8000", [P1])
    run_sync(handlers.on_worker_event(p, forged))  # unsigned
    run_sync(handlers.on_worker_event(p, sign(forged, b"guessed")))  # wrong secret
    run_sync(handlers.on_worker_event(p, sign(forged, MASTER.encode())))  # not w1's own key
    run_sync(handlers.on_worker_event(p, heartbeat("evil", "http://evil:8000", [P1])))
    assert p.tables.workers == before and route(p) == "http://w1:8000"
    assert p.stats["unauthenticated_events"] == 4


def test_a_worker_cannot_sign_events_as_another() -> None:
    p, _ = pipeline(Port({}), worker_events_secret=MASTER)
    run_sync(handlers.on_worker_event(p, sign(heartbeat("w1", "http://w1:8000", []), key_of("w1"))))
    run_sync(handlers.on_worker_event(p, sign(heartbeat("w2", "http://w2:8000", []), key_of("w2"))))
    before = dict(p.tables.workers)
    # w2's host, holding only w2's key, claims to be w1 and to hold the hot prefix.
    run_sync(handlers.on_worker_event(p, sign(heartbeat("w1", "http://w2:8000", [P1]),
                                              key_of("w2"))))  # fmt: skip
    assert p.tables.workers == before and p.stats["unauthenticated_events"] == 1
    assert sorted(p.tables.workers) == ["w1", "w2"]


@given(master=st.binary(min_size=1, max_size=64), a=st.text(max_size=40), b=st.text(max_size=40))
def test_worker_keys_are_pure_and_distinct_per_worker(master: bytes, a: str, b: str) -> None:
    assert derive_worker_key(master, a) == derive_worker_key(master, a)
    assert len(derive_worker_key(master, a)) == 64
    assert (derive_worker_key(master, a) == derive_worker_key(master, b)) == (a == b)


def test_without_a_secret_the_app_trusts_events_as_before() -> None:
    p, _ = pipeline(Port({}))
    run_sync(handlers.on_worker_event(p, heartbeat("w2", "http://w2:8000", [P1])))
    assert "w2" in p.tables.workers


@given(url=st.text(max_size=50), n=st.integers(0, 3))
def test_a_signature_survives_the_wire_and_any_change_breaks_it(url: str, n: int) -> None:
    signed = sign(heartbeat("w1", "http://w1", [P1] * n), SECRET)
    received = decode(encode(signed), WorkerEvent)
    assert authentic(received, SECRET)
    assert not authentic(received.model_copy(update={"url": url + "x"}), SECRET)
    assert not authentic(received, b"other")
