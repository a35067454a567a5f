"""Faults lose nothing: classification, backoff, dead-letter bounds, guarded timers, the
route table, worker epochs, prefill expiry and re-sends (pure, no Kafka)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from schemas import KbChange, SchemaError, WarmupCommand, WorkerEvent, deadletter, decode, encode
from streams import faults, handlers
from streams.logic import (
    apply_worker_event,
    epoch_order,
    needs_resend,
    plan_prefix_op,
    prefill_pending,
)
from streams.records import DocLink, PrefixOp, PrefixState, WorkerState
from streams.routes import BY_TYPE, ROUTES, route_for
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
    calls, slept, seen = [], [], []

    async def fn():
        calls.append(1)
        if fails:
            raise fails.pop(0)

    async def sleep(s):
        slept.append(s)

    backoff = faults.Backoff(initial_s=1, max_s=2, attempts=3)
    err = asyncio.run(faults.retry(fn, backoff, lambda e, n, d: seen.append(d), sleep))
    return err, calls, slept


def test_transient_failures_are_retried_until_they_pass():
    err, calls, slept = _retry([OSError("disk"), OSError("disk")])
    assert err is None and len(calls) == 3 and slept == [1, 2]


def test_transient_failure_past_the_budget_is_returned():
    err, calls, slept = _retry([OSError(str(i)) for i in range(10)])
    assert isinstance(err, OSError) and len(calls) == 4 and slept == [1, 2, 2]


def test_permanent_failure_is_not_retried():
    err, calls, slept = _retry([SchemaError("x", "bad")])
    assert isinstance(err, SchemaError) and len(calls) == 1 and slept == []


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
    p.tables.workers["w1"] = WorkerState(
        worker_id="w1", ready=True, mem_total=10**9, last_seen=100.0, prefixes=[P1], epoch=1
    ).model_dump(mode="json")
    state = PrefixState(tenant="default", chunk_refs=REFS, token_ids=[1] * 32, expires_at=1e9)
    p.tables.prefixes[P1] = state.model_dump(mode="json")
    ready = WorkerEvent(worker_id="w1", kind="ready", epoch=2, mem_total_bytes=10**9)
    run_sync(handlers.on_worker_event(p, ready))
    assert [o.op for o in out.ops] == ["warm_on"]
    run_sync(handlers.on_prefix_op(p, out.ops[0]))
    assert [c.op for c in out.commands] == ["prefill"]
    assert p.stats["worker_restarts"] == 1


def test_leftover_events_of_an_old_boot_are_ignored():
    p, _ = pipeline(Port({}))
    p.tables.workers["w1"] = WorkerState(worker_id="w1", epoch=9).model_dump(mode="json")
    run_sync(handlers.on_worker_event(p, WorkerEvent(worker_id="w1", kind="stopped", epoch=3)))
    assert p.stats["stale_epoch_events"] == 1
    assert WorkerState.model_validate(p.tables.workers["w1"]).epoch == 9


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
    p.tables.prefixes[P1] = _warm_state(prefill_at=95.0).model_dump(mode="json")
    run_sync(handlers.on_prefix_op(p, out.ops[0]))
    assert PrefixState.model_validate(p.tables.prefixes[P1]).prefill_at is None
    # A prompt cached by a request (no command) confirms no prefill: no op.
    cached = WorkerEvent(worker_id="w1", kind="stored", prefix_hash="b" * 64)
    run_sync(handlers.on_worker_event(p, cached))
    assert len(out.ops) == 1


def test_resend_timer_asks_once_per_unconfirmed_prefill():
    p, out = pipeline(Port({}), prefill_resends=1)
    p.tables.prefixes[P1] = _warm_state(prefill_at=60.0).model_dump(mode="json")
    p.tables.prefixes["b" * 64] = _warm_state(prefill_at=60.0, resends=1).model_dump(mode="json")
    assert run_sync(handlers.resend_prefills(p)) == 1
    assert [(o.op, o.prefix_hash) for o in out.ops] == [("resend", P1)]


def test_command_expiry_round_trip():
    cmd = WarmupCommand(command_id="c", op="prefill", token_ids=[1], expires_at=datetime.now(UTC))
    assert decode(encode(cmd)).expires_at == cmd.expires_at
