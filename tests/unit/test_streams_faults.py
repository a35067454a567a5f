"""Faults lose nothing: classification, backoff, dead-letter bounds, guarded timers, the
route table, worker epochs, prefill expiry and re-sends (pure, no Kafka)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from schemas import (
    ChunkRef,
    KbChange,
    QueryEvent,
    SchemaError,
    WarmupCommand,
    WorkerEvent,
    deadletter,
    decode,
    encode,
)
from streams.decide.logic import (
    apply_worker_event,
    epoch_order,
    needs_resend,
    plan_prefix_op,
    prefill_pending,
)
from streams.decide.records import DocLink, PrefixOp, PrefixState, WorkerState, doc_key
from streams.handle import handlers
from streams.handle.ports import WarmPrefix
from streams.shell import faults
from streams.shell.routes import BY_TYPE, ROUTES, route_for
from streams.sim import run_sync
from tests.unit.conftest import P1, REFS, Port, pipeline

# --- transient vs permanent --------------------------------------------------------------


class _M(BaseModel):
    x: int


def _validation_error() -> Exception:
    try:
        _M(x="no")
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError


@pytest.mark.parametrize(
    ("exc", "permanent"),
    [
        (SchemaError("op", "bad"), True),
        (_validation_error(), True),
        (OSError(28, "No space left on device"), False),
        (RuntimeError("Storage folder is already accessed by another instance"), False),
        (ConnectionError("broker"), False),
        (TimeoutError(), False),
    ],
)
def test_permanent_or_transient(exc, permanent):
    assert faults.is_permanent(exc) is permanent


def test_backoff_is_bounded_and_exponential():
    b = faults.Backoff(initial_s=0.5, max_s=4.0, attempts=6)
    assert list(b.delays()) == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.budget_s == 15.5


def _retry(fails: list[Exception]):
    calls, slept, seen, parked = [], [], [], []

    async def fn():
        calls.append(1)
        if fails:
            raise fails.pop(0)

    async def sleep(s):
        slept.append(s)
        parked_now.append(sum(parked))

    parked_now: list[int] = []
    backoff = faults.Backoff(initial_s=1, max_s=2, attempts=3)
    err = asyncio.run(faults.retry(fn, backoff, lambda e, n, d: seen.append(d), sleep,
                                   on_park=parked.append))
    return err, calls, slept, parked, parked_now


def test_transient_failures_are_retried_until_they_pass():
    err, calls, slept, parked, _ = _retry([OSError("disk"), OSError("disk")])
    assert err is None and len(calls) == 3 and slept == [1, 2] and parked == []


def test_a_transient_failure_past_the_budget_is_parked_never_given_up():
    """Before: after the budget (3.5 min by default) the error came back, the record was
    dead-lettered and acked, and the KB change was lost. Now it is retried every `max_s`
    until it passes, counted as parked meanwhile (+1 once, -1 when it passes)."""
    err, calls, slept, parked, parked_now = _retry([OSError(str(i)) for i in range(10)])
    assert err is None and len(calls) == 11
    assert slept == [1, 2, 2] + [2] * 7
    assert parked == [1, -1]
    assert parked_now == [0, 0, 0] + [1] * 7  # the gauge is up while it waits past the budget


def test_permanent_failure_is_not_retried():
    err, calls, slept, _, _ = _retry([SchemaError("x", "bad")])
    assert isinstance(err, SchemaError) and len(calls) == 1 and slept == []


def test_retry_until_done_outlasts_any_budget_and_returns_the_result():
    fails = [OSError(str(i)) for i in range(6)]  # past the attempts of the backoff
    slept, seen = [], []

    async def fn():
        if fails:
            raise fails.pop(0)
        return "sent"

    async def sleep(s):
        slept.append(s)

    backoff = faults.Backoff(initial_s=1, max_s=4, attempts=2)
    got = asyncio.run(faults.retry_until_done(fn, backoff, lambda e, d: seen.append(str(e)),
                                              sleep))
    assert got == "sent" and slept == [1, 2, 4, 4, 4, 4]
    assert seen == ["0", "1", "2", "3", "4", "5"]


def test_retry_until_done_stops_when_cancelled():
    async def main():
        async def fn():
            raise OSError("down")

        task = asyncio.create_task(faults.retry_until_done(
            fn, faults.Backoff(initial_s=10), lambda e, d: None))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


# --- dead letters ------------------------------------------------------------------------


def test_small_dead_letter_keeps_the_payload():
    origin = deadletter.Origin("kb.changes", 2, 41, b"k", b"not json")
    letter = deadletter.dead_letter(origin, "bad", None, 1024)
    assert base64.b64decode(letter.value_b64) == b"not json"
    assert not letter.truncated and letter.value_bytes == 8
    assert decode(encode(letter)) == letter


def test_large_dead_letter_fits_the_producer_limit():
    value = b"x" * 800_000
    limit = deadletter.value_limit(1_000_000, 10**9)
    origin = deadletter.Origin("kb.changes", 0, 7, b"k", value)
    letter = deadletter.dead_letter(origin, "bad", None, limit)
    assert len(encode(letter)) < 1_000_000
    assert letter.truncated and letter.value_bytes == 800_000
    assert letter.value_sha256 == hashlib.sha256(value).hexdigest()
    assert letter.offset == 7 and "truncated" in letter.reason


# --- guarded timers ----------------------------------------------------------------------


def test_a_raising_timer_is_logged_and_counted(caplog):
    errors = []

    async def boom():
        raise KeyError("gone")

    run = faults.guarded("ragwarm.hot-tick", boom, lambda: errors.append(1))
    asyncio.run(run())
    asyncio.run(run())
    assert errors == [1, 1]
    assert "ragwarm.hot-tick failed" in caplog.text


def test_plan_hot_survives_a_hot_prefix_forgotten_meanwhile(monkeypatch):
    p, out = pipeline(Port({}))
    p.tracker.hot["gone"] = PrefixOp(op="warm", prefix_hash="gone")
    p.tracker.forget("gone")  # an invalidation while the plan awaited the store
    # The plan still says "gone" cooled down: releasing it must not raise KeyError.
    monkeypatch.setattr(handlers.logic, "plan_hot_set", lambda *a, **k: ([], ["gone"]))
    run_sync(handlers.plan_hot(p))
    assert out.ops == []


# --- the route table ---------------------------------------------------------------------


def test_every_record_type_has_one_route():
    assert len(BY_TYPE) == len(ROUTES) == 6
    assert route_for(PrefixOp(op="warm", prefix_hash=P1)).handle is handlers.on_prefix_op
    assert route_for(DocLink(doc_id="d", prefix_hash=P1)).handle is handlers.on_doc_link
    with pytest.raises(TypeError, match="known"):
        route_for(object())


def test_routes_decode_their_records():
    change = KbChange(op="delete", doc_id="d.md", version=3)
    route = BY_TYPE[KbChange]
    assert route.decode(encode(change)) == change and route.after_index_recovery
    with pytest.raises(SchemaError):
        route.decode(b"{}")


def test_every_route_refuses_a_tombstone_as_bad_input():
    # A record without a value (a delete is a record, even on the compacted kb.changes) is
    # dead-lettered with a reason that says so.
    for route in ROUTES:
        with pytest.raises(SchemaError, match="tombstone"):
            route.decode(None)


# --- worker epochs -----------------------------------------------------------------------


def _ev(kind: str, epoch: int | None, **kw) -> WorkerEvent:
    return WorkerEvent(worker_id="w", kind=kind, epoch=epoch, **kw)


def test_epoch_order():
    row = WorkerState(worker_id="w", epoch=5)
    assert epoch_order(None, _ev("ready", 5)) == "new"
    assert epoch_order(row, _ev("ready", 6)) == "new"
    assert epoch_order(row, _ev("stored", 5)) == "same"
    assert epoch_order(row, _ev("stopped", 4)) == "old"
    assert epoch_order(row, _ev("heartbeat", None)) == "same"  # a v1 worker
    assert epoch_order(WorkerState(worker_id="w"), _ev("ready", 1)) == "new"


def test_a_restarted_worker_starts_from_an_empty_row():
    row = WorkerState(worker_id="w", epoch=5, ready=True, prefixes=[P1], mem_used=900)
    after = apply_worker_event(row, _ev("ready", 6, mem_total_bytes=1000), 10.0)
    assert after.prefixes == [] and after.epoch == 6 and after.mem_used == 0 and after.ready


def test_an_older_boot_changes_nothing():
    row = WorkerState(worker_id="w", epoch=5, ready=True, prefixes=[P1])
    assert apply_worker_event(row, _ev("stopped", 4), 10.0) == row


def test_restart_rewarms_tracked_prefixes():
    """The defect: a SIGKILLed worker back with the same id kept its old prefix list, so
    the ready-warmup's prefills were all skipped as 'already held'."""
    p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}))
    p.settings = p.settings.model_copy(update={"hot_tokens": False})
    p.tables.worker_states["w1"] = WorkerState(
        worker_id="w1", ready=True, mem_total=10**9, last_seen=100.0, prefixes=[P1], epoch=1
    )
    state = PrefixState(tenant="default", chunk_refs=REFS, token_ids=[1] * 32, expires_at=1e9)
    p.tables.prefix_states[P1] = state
    ready = WorkerEvent(worker_id="w1", kind="ready", epoch=2, mem_total_bytes=10**9)
    run_sync(handlers.on_worker_event(p, ready))
    assert [o.op for o in out.ops] == ["warm_on"]
    run_sync(handlers.on_prefix_op(p, out.ops[0]))
    assert [c.op for c in out.commands] == ["prefill"]
    assert p.stats["worker_restarts"] == 1


def test_leftover_events_of_an_old_boot_are_ignored():
    p, _ = pipeline(Port({}))
    p.tables.worker_states["w1"] = WorkerState(worker_id="w1", epoch=9)
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w1", kind="stopped", epoch=3)))
    assert p.stats["stale_epoch_events"] == 1
    assert p.tables.worker_states["w1"].epoch == 9


def _wall(p, seconds: float) -> None:
    p.wall_clock = lambda: seconds


def test_a_huge_epoch_is_refused_and_does_not_lock_the_worker_out():
    """The defect: one event with a huge boot epoch became the row's epoch, and every later
    (honest, smaller) epoch was dropped as old: the worker was out of routing for good."""
    p, _ = pipeline(Port({}))
    _wall(p, 1_000.0)  # this host's clock: epoch 1e9 us
    honest = 999_000_000
    forged = WorkerEvent(worker_id="w9", kind="ready", epoch=2**62, mem_total_bytes=10**9)
    run_sync(handlers.on_worker_event(p, forged))
    assert p.stats["future_epoch_events"] == 1 and "w9" not in p.tables.workers
    ready = WorkerEvent(worker_id="w9", kind="ready", epoch=honest, mem_total_bytes=10**9,
                        url="http://w9")
    run_sync(handlers.on_worker_event(p, ready))
    row = p.tables.worker_states["w9"]
    assert row.ready and row.epoch == honest and row.url == "http://w9"


def test_a_row_locked_by_a_huge_epoch_is_replaced_by_the_next_honest_boot():
    # A row written before the bound existed: the next honest boot takes it over.
    p, _ = pipeline(Port({}))
    _wall(p, 1_000.0)
    p.tables.worker_states["w9"] = WorkerState(worker_id="w9", epoch=2**62, last_seen=100.0,
                                         ready=False)
    beat = WorkerEvent(worker_id="w9", kind="heartbeat", epoch=999_000_000)
    run_sync(handlers.on_worker_event(p, beat))
    row = p.tables.worker_states["w9"]
    assert row.epoch == 999_000_000 and row.ready and p.stats["stale_epoch_events"] == 0


def test_a_worker_whose_clock_stepped_back_comes_back_once_its_heartbeats_stopped():
    p, _ = pipeline(Port({}), worker_stale_s=30.0)  # the handlers' clock reads 100.0
    _wall(p, 1_000.0)
    p.tables.worker_states["w9"] = WorkerState(worker_id="w9", epoch=900_000_000, last_seen=90.0,
                                         ready=True)
    back = WorkerEvent(worker_id="w9", kind="ready", epoch=800_000_000)
    run_sync(handlers.on_worker_event(p, back))  # heard of 10 s ago: still a leftover
    assert p.tables.worker_states["w9"].epoch == 900_000_000
    assert p.stats["stale_epoch_events"] == 1
    p.clock = lambda: 200.0  # its heartbeats stopped 110 s ago
    run_sync(handlers.on_worker_event(p, back))
    row = p.tables.worker_states["w9"]
    assert row.epoch == 800_000_000 and row.ready and p.stats["worker_restarts"] == 1
    stopped = WorkerEvent(worker_id="w9", kind="stopped", epoch=700_000_000)
    p.clock = lambda: 400.0
    run_sync(handlers.on_worker_event(p, stopped))  # a leftover `stopped` stays one
    assert p.tables.worker_states["w9"].epoch == 800_000_000


# --- prefill expiry and re-sends -----------------------------------------------------------


def _warm_state(**kw) -> PrefixState:
    base = dict(tenant="default", chunk_refs=REFS, token_ids=[1] * 32, expires_at=1000.0)
    return PrefixState(**(base | kw))


def test_prefills_carry_an_expiry_and_invalidations_do_not():
    p, out = pipeline(Port({("default", "d.md#0"): "1" * 64}), command_expiry_s=60.0)
    op = PrefixOp(op="warm", prefix_hash=P1, chunk_refs=REFS, token_ids=[1] * 32)
    run_sync(handlers.on_prefix_op(p, op))
    run_sync(handlers.on_prefix_op(p, PrefixOp(op="invalidate", prefix_hash=P1)))
    prefill, invalidate = out.commands
    assert prefill.expires_at == datetime.fromtimestamp(160.0, UTC)
    assert invalidate.expires_at is None


def test_needs_resend_window():
    ready = [WorkerState(worker_id="w1", ready=True)]
    assert not needs_resend(P1, _warm_state(), ready, 100.0, 90.0)  # never sent
    assert not needs_resend(P1, _warm_state(prefill_at=90.0), ready, 100.0, 90.0)  # too soon
    assert needs_resend(P1, _warm_state(prefill_at=60.0), ready, 100.0, 90.0)
    assert not needs_resend(P1, _warm_state(prefill_at=0.0), ready, 100.0, 90.0)  # too old
    held = [WorkerState(worker_id="w1", ready=True, prefixes=[P1])]
    assert not needs_resend(P1, _warm_state(prefill_at=60.0), held, 100.0, 90.0)


def test_resend_goes_to_another_worker_when_the_first_is_gone():
    workers = [
        WorkerState(worker_id="gone", ready=False, mem_total=100),
        WorkerState(worker_id="w2", ready=True, mem_total=100),
    ]
    state = _warm_state(prefill_at=50.0, worker_id="gone")
    plan = plan_prefix_op(PrefixOp(op="resend", prefix_hash=P1), state, workers, 100.0, 3600.0)
    (cmd,) = plan.commands
    assert cmd.worker_id == "w2" and cmd.op == "prefill"
    assert plan.state.resends == 1 and plan.state.prefill_at == 100.0


def test_a_stored_report_ends_the_pending_prefill():
    # Sent 10 s ago: pending, so a warm op of the unheld prefix waits for it.
    state = _warm_state(prefill_at=90.0, worker_id="w1", resends=1)
    ready = [WorkerState(worker_id="w1", ready=True, mem_total=100)]
    warm = PrefixOp(op="warm", prefix_hash=P1, chunk_refs=REFS, token_ids=[1] * 32)
    assert prefill_pending(state, 100.0)
    assert plan_prefix_op(warm, state, ready, 100.0, 3600.0).commands == []
    # The worker reported it stored: nothing is on its way any more.
    plan = plan_prefix_op(PrefixOp(op="stored", prefix_hash=P1), state, ready, 100.0, 3600.0)
    assert plan.commands == [] and plan.state is not None
    assert plan.state.prefill_at is None and plan.state.resends == 0
    assert not prefill_pending(plan.state, 100.0)
    # Evicted right after: warmed again at once, and never taken for a lost prefill.
    (cmd,) = plan_prefix_op(warm, plan.state, ready, 101.0, 3600.0).commands
    assert cmd.op == "prefill"
    assert not needs_resend(P1, plan.state, ready, 125.0, 90.0)
    # A report about an untracked prefix, or one with no prefill sent, changes nothing.
    assert plan_prefix_op(PrefixOp(op="stored", prefix_hash=P1), None, ready, 1, 1).state is None
    assert plan_prefix_op(PrefixOp(op="stored", prefix_hash=P1), plan.state, ready, 1, 1).state \
        == plan.state


def test_a_prefill_stored_on_a_worker_reaches_its_prefix_owner():
    p, out = pipeline(Port({}))
    stored = WorkerEvent(worker_id="w1", kind="stored", prefix_hash=P1, command_id="c1")
    run_sync(handlers.on_worker_event(p, stored))
    assert [(o.op, o.prefix_hash) for o in out.ops] == [("stored", P1)]
    p.tables.prefix_states[P1] = _warm_state(prefill_at=95.0)
    run_sync(handlers.on_prefix_op(p, out.ops[0]))
    assert p.tables.prefix_states[P1].prefill_at is None
    # A prompt cached by a request (no command) confirms no prefill: no op.
    cached = WorkerEvent(worker_id="w1", kind="stored", prefix_hash="b" * 64)
    run_sync(handlers.on_worker_event(p, cached))
    assert len(out.ops) == 1


def test_resend_timer_asks_once_per_unconfirmed_prefill():
    p, out = pipeline(Port({}), prefill_resends=1)
    p.tables.prefix_states[P1] = _warm_state(prefill_at=60.0)
    p.tables.prefix_states["b" * 64] = _warm_state(prefill_at=60.0, resends=1)
    assert run_sync(handlers.resend_prefills(p)) == 1
    assert [(o.op, o.prefix_hash) for o in out.ops] == [("resend", P1)]


def test_command_expiry_round_trip():
    cmd = WarmupCommand(command_id="c", op="prefill", token_ids=[1], expires_at=datetime.now(UTC))
    assert decode(encode(cmd)).expires_at == cmd.expires_at


def _letter_of(value: bytes, limit: int = 1_000_000) -> deadletter.DeadLetter:
    """The dead letter the KB route sends for `value` (decode, classify, build)."""
    try:
        BY_TYPE[KbChange].decode(value)
    except Exception as exc:  # noqa: BLE001 - the route's decode error is the point
        reason, field = faults.reason_of(exc)
    else:
        raise AssertionError("the record decoded")
    origin = deadletter.Origin("kb.changes", 0, 9, b"k", value)
    return deadletter.dead_letter(origin, reason, field, deadletter.value_limit(limit, 10**9))


def test_a_huge_metadata_key_gives_a_letter_that_fits_the_producer_limit():
    """The audit's case: a 900 KB metadata key became the letter's `error_field` whole, a
    1.25 MB letter the producer refused for good (the partition stalled)."""
    key = "k" * 900_000
    value = ('{"schema_name":"kb_change","op":"upsert","doc_id":"d","version":1,'
             f'"metadata":{{"{key}":[1]}}}}').encode()
    letter = _letter_of(value)
    assert len(encode(letter)) < 1_000_000
    assert letter.error_field is not None and len(letter.error_field) <= deadletter.MAX_FIELD
    assert letter.error_field.startswith("metadata.kkk")
    assert "error_field of" in letter.reason and "truncated" in letter.reason
    assert decode(encode(letter)) == letter


@pytest.mark.parametrize("char", ["k", "\x01", "é", "\U0001f600"])
def test_every_text_field_of_a_letter_is_bounded_in_bytes(char):
    # A bound in characters is not one in bytes: a control character is 6 bytes as JSON.
    big = char * 200_000
    origin = deadletter.Origin(big, 0, 1, big.encode(), big.encode())
    limit = 1_000_000
    letter = deadletter.dead_letter(origin, big, big, deadletter.value_limit(limit, 10**9))
    assert len(encode(letter)) < limit
    assert "reason of" in letter.reason and "error_field of" in letter.reason
    assert decode(encode(letter)) == letter


def test_a_small_field_and_reason_stay_whole():
    origin = deadletter.Origin("kb.changes", 0, 1, b"k", b"v")
    letter = deadletter.dead_letter(origin, "bad \x01 op", "op", 1024)
    assert (letter.reason, letter.error_field) == ("bad \x01 op", "op")


# --- retries redo the whole of a change ----------------------------------------------------


class _FlakyRetrieval(Port):
    """Retrieval that fails once (the store busy), then finds nothing new."""

    def __init__(self) -> None:
        super().__init__({})
        self.failures = 1

    def prefix_for_question(self, question, tenant):
        if self.failures:
            self.failures -= 1
            raise OSError("store busy")
        return super().prefix_for_question(question, tenant)


def test_a_retried_apply_indexed_still_does_its_follow_up_work():
    """The defect: the first attempt wrote the docs table, then its re-check failed; the
    retry planned from the new state, found nothing changed and skipped the re-checks,
    the chunk warmup and synthesis."""
    from streams.decide.records import DocState

    port = _FlakyRetrieval()
    p, _ = pipeline(port, hot_tokens=False)
    p.tables.worker_states["w1"] = WorkerState(worker_id="w1", ready=True, mem_total=10**12,
                                         last_seen=100.0)
    old = DocState(version=1, chunks={"d.md#0": "1" * 64})
    p.tables.doc_states["d.md"] = old
    p.asks.observe("f" * 64, "default", "another question?", REFS, 32, 100.0)
    change = KbChange(op="upsert", doc_id="d.md", version=2, text="new")
    new_chunks = {"d.md#0": "2" * 64}

    async def apply():
        await handlers.apply_indexed(p, change, new_chunks)

    backoff = faults.Backoff(initial_s=0.001, max_s=0.001, attempts=3)
    assert asyncio.run(faults.retry(apply, backoff, lambda *a: None)) is None
    assert port.failures == 0 and p.stats["edit_rechecks"] == 1
    assert p.tables.docs["d.md"]["version"] == 2 and p.applying == {}


class _FlakyQuestionRetrieval(Port):
    """Retrieval that fails once (the store busy), then finds the edited chunk's prefix."""

    def __init__(self) -> None:
        super().__init__({("default", "d.md#0"): "2" * 64})
        self.failures = 1

    def prefix_for_question(self, question, tenant):
        self.calls.append("prefix_for_question")
        if self.failures:
            self.failures -= 1
            raise OSError("store busy")
        refs = [ChunkRef(chunk_id="d.md#0", content_hash="2" * 64)]
        return WarmPrefix(prefix_hash="f" * 64, token_ids=[8] * 32, chunk_refs=refs)


def test_an_invalidation_retried_after_its_rewarm_failed_still_rewarms():
    """The defect: the op dropped the prefix's state before retrieving its questions'
    new prefixes; the retry (or a replay after a crash) found no state, so no question to
    re-warm, and the edited question stayed cold."""
    port = _FlakyQuestionRetrieval()
    p, out = pipeline(port, hot_tokens=False)
    p.tables.prefix_states[P1] = PrefixState(
        tenant="default", chunk_refs=REFS, token_ids=[7] * 32, questions=["why?"],
        expires_at=1000.0, hot=True)
    op = PrefixOp(op="invalidate", prefix_hash=P1, chunk_refs=REFS, reason="d.md v2")

    async def apply():
        await handlers.on_prefix_op(p, op)

    backoff = faults.Backoff(initial_s=0.001, max_s=0.001, attempts=3)
    assert asyncio.run(faults.retry(apply, backoff, lambda *a: None)) is None
    assert port.failures == 0
    assert [(o.op, o.prefix_hash) for o in out.ops] == [("warm", "f" * 64)]
    assert P1 not in p.tables.prefixes and p.stats["invalidations"] == 1


class _Killed(Exception):
    """The process dies here: nothing after it runs, what was written stays."""


def test_a_change_replayed_after_a_crash_mid_send_still_invalidates():
    """The docs table takes the new version before the change's ops are sent. A crash
    between the two replays the change (its offset not committed) onto the new version, in
    an instance without the first attempt's memory (`applying`): the dependents' links
    still name the old chunk, so the replay invalidates them all the same."""
    from streams.decide.records import DocState

    port = Port({("default", "d.md#0"): "2" * 64})
    p, out = pipeline(port, hot_tokens=False)
    key = doc_key("default", "d.md")
    p.tables.doc_states[key] = DocState(version=1, chunks={"d.md#0": "1" * 64})
    p.tables.doc_prefixes[key] = {P1: [r.model_dump(mode="json") for r in REFS]}
    change = KbChange(op="upsert", doc_id="d.md", version=2, text="new")

    async def dying_op(op):
        raise _Killed

    out.op = dying_op
    with pytest.raises(_Killed):
        run_sync(handlers.apply_indexed(p, change, {"d.md#0": "2" * 64}))
    taker, taker_out = pipeline(port, hot_tokens=False)
    taker.tables = p.tables
    run_sync(handlers.apply_indexed(taker, change, {"d.md#0": "2" * 64}))
    assert [(o.op, o.prefix_hash) for o in taker_out.ops] == [("invalidate", P1)]
    assert taker.tables.doc_states[key].version == 2


class _FlakyRows(dict):
    """A windows table whose first writes fail (the changelog producer busy)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def __setitem__(self, key, value):
        if self.failures:
            self.failures -= 1
            raise OSError("changelog busy")
        super().__setitem__(key, value)


def _query_events(n: int) -> list:
    from types import SimpleNamespace

    from tests.unit.conftest import query

    return [SimpleNamespace(message=SimpleNamespace(
        topic="rag.queries", partition=0, offset=i, key=None,
        value=encode(query(f"question {i}?")))) for i in range(n)]


def test_a_failed_window_write_is_retried_not_the_batch_lost():
    """The defect: the query agent flushed its windows outside the retrying runner, and
    the flush dropped its pending rows before writing them: one failed write lost the
    counts of the whole batch."""
    from streams.decide.hot import HotTracker
    from streams.shell.agents import RecordRunner, handle_queries

    p, _ = pipeline(Port({}), retry_initial_s=0.001, retry_max_s=0.001)
    rows = _FlakyRows(failures=2)
    p.tracker = HotTracker(600.0, 60.0, rows=rows)
    runner = RecordRunner(p, None, BY_TYPE[QueryEvent])
    asyncio.run(handle_queries(runner, _query_events(3)))
    assert rows.failures == 0 and len(rows) >= 1 and p.stats["retries"] == 2
    assert p.tracker.flush(100.0) == 0  # nothing left behind, nothing lost
    assert p.stats["queries"] == 3 and p.stats["dead_letters"] == 0


def test_a_failed_count_goes_through_the_runner(monkeypatch):
    from streams.shell.agents import RecordRunner, handle_queries

    p, _ = pipeline(Port({}), retry_initial_s=0.001, retry_max_s=0.001)
    calls = []
    real = handlers.count_query

    def flaky(pp, q):
        calls.append(q.question)
        if len(calls) == 1:
            raise OSError("busy")
        return real(pp, q)

    runner = RecordRunner(p, None, BY_TYPE[QueryEvent])
    monkeypatch.setattr(handlers, "count_query", flaky)
    asyncio.run(handle_queries(runner, _query_events(2)))
    # The failed count is tried again by the runner (not dropped), then the next query.
    assert calls == ["question 0?", "question 0?", "question 1?"]
    assert p.stats["queries"] == 2 and p.stats["dead_letters"] == 0


def test_a_failed_window_flush_keeps_its_rows_for_the_next_one():
    """The flush took its pending rows out before writing them: a write that failed lost
    them, whoever retried it."""
    from streams.decide.hot import HotPayload, HotTracker

    rows = _FlakyRows(failures=1)
    tracker = HotTracker(600.0, 60.0, rows=rows)
    tracker.observe(P1, HotPayload(tenant="default", question="q?", chunk_refs=tuple(REFS),
                                   prefix_tokens=32), 100.0)
    with pytest.raises(OSError):
        tracker.flush(100.0)
    assert tracker.flush(100.0) == 1 and len(rows) == 1
