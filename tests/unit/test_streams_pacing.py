"""One warm op per tracked prefix per interval from its queries (`streams.decide.pacing`): while
the prefix is on no worker, every query of it used to send the same op."""

from __future__ import annotations

import asyncio

import pytest

from streams.decide.pacing import KeyPacing
from streams.decide.records import PrefixState
from streams.handle import handlers
from tests.unit.conftest import P1, REFS, Port, pipeline, query


def test_a_key_that_never_sent_is_due():
    assert KeyPacing().due("a", now=0.0, interval_s=2.0)


def test_a_key_is_due_again_once_the_interval_has_passed():
    pacing = KeyPacing()
    pacing.sent("a", now=10.0, interval_s=2.0)
    assert not pacing.due("a", now=11.9, interval_s=2.0)
    assert pacing.due("a", now=12.0, interval_s=2.0)
    assert pacing.due("b", now=11.0, interval_s=2.0)  # per key


def test_a_zero_interval_paces_nothing():
    pacing = KeyPacing()
    pacing.sent("a", now=10.0, interval_s=0.0)
    assert pacing.due("a", now=10.0, interval_s=0.0)


def test_over_capacity_only_the_keys_still_pacing_are_kept():
    pacing = KeyPacing(capacity=2)
    pacing.sent("old", now=0.0, interval_s=2.0)
    pacing.sent("recent", now=9.0, interval_s=2.0)
    pacing.sent("new", now=10.0, interval_s=2.0)
    assert set(pacing.last) == {"recent", "new"}


def unheld_tracked(port: Port, now: float):
    """A pipeline tracking P1 (known, listing the question) that no worker holds."""
    p, out = pipeline(port, now=now)
    state = PrefixState(tenant="default", chunk_refs=REFS, token_ids=[7] * 32,
                        questions=["why?"], expires_at=now + 10_000)
    p.tables.prefix_states[P1] = state
    return p, out


def test_queries_of_an_unheld_prefix_send_one_op_per_interval():
    port = Port({("default", "d.md#0"): "1" * 64})
    clock = [100.0]
    p, out = unheld_tracked(port, 100.0)
    p.clock = lambda: clock[0]

    async def ask(times: int) -> None:
        for _ in range(times):
            await handlers.on_query(p, query())

    asyncio.run(ask(5))
    assert len(out.ops) == 1  # not one per query
    clock[0] += p.settings.query_op_interval_s
    asyncio.run(ask(3))
    assert len(out.ops) == 2
    assert p.stats["queries"] == 8  # every query still counts for the hot windows


def test_with_a_zero_interval_every_query_of_an_unheld_prefix_sends_its_op():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = pipeline(port, query_op_interval_s=0)
    p2, _ = unheld_tracked(port, 100.0)
    p.tables.prefixes.update(p2.tables.prefixes)
    asyncio.run(handlers.on_query(p, query()))
    asyncio.run(handlers.on_query(p, query()))
    assert len(out.ops) == 2


def test_a_retried_warm_op_does_not_count_its_query_again():
    """The agent retries only `send_query_op`: counting happened once, before it."""
    port = Port({("default", "d.md#0"): "1" * 64})
    p, out = unheld_tracked(port, 100.0)
    assert handlers.count_query(p, query())  # due: tracked, on no worker
    sends = out.op

    async def flaky(op) -> None:
        out.op = sends  # the next attempt goes through
        raise ConnectionError("broker away")

    out.op = flaky
    with pytest.raises(ConnectionError):
        asyncio.run(handlers.send_query_op(p, query()))
    asyncio.run(handlers.send_query_op(p, query()))  # the runner's retry
    assert len(out.ops) == 1
    assert p.stats["queries"] == 1
    assert not handlers.count_query(p, query())  # paced once sent
