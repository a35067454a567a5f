"""The index replica catches up once per batch or tick: a catch-up begun after the inputs
being handled had all arrived is reused; one begun before them is not (their chunks may have
been published after it asked for the end offsets)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from streams.handle import catchup, handlers
from streams.shell.replica import ChunkReplica
from tests.unit.conftest import Port, pipeline, warm


def test_a_catch_up_begun_after_the_inputs_arrived_covers_them():
    assert catchup.covers(caught_up_from=10.0, arrived_at=9.5)
    assert catchup.covers(caught_up_from=10.0, arrived_at=10.0)


def test_a_catch_up_begun_before_the_inputs_arrived_does_not():
    # Another instance's op arrived after the end offsets were read: its chunks may not be
    # among them, so an old ref could still look current.
    assert not catchup.covers(caught_up_from=10.0, arrived_at=10.5)


def test_no_catch_up_yet_or_no_arrival_time_means_catching_up():
    assert not catchup.covers(caught_up_from=None, arrived_at=1.0)
    assert not catchup.covers(caught_up_from=10.0, arrived_at=None)


def test_the_arrival_time_holds_inside_the_block_only():
    assert catchup.arrived() is None
    with catchup.inputs_from(3.0):
        assert catchup.arrived() == 3.0
    assert catchup.arrived() is None


def replica() -> ChunkReplica:
    p, _ = pipeline(Port({}))
    topic = SimpleNamespace(get_topic_name=lambda: "rag.chunks", partitions=4)
    # No consumer is ever made here: a catch-up that is not reused waits for one and times out.
    return ChunkReplica(p, store=None, topic=topic, deadletter=None,
                        make_consumer=lambda: None, follow=True)


def test_the_replica_reuses_a_catch_up_that_covers_the_batch_without_the_broker():
    r = replica()
    r.caught_up_from = 50.0
    assert asyncio.run(r.caught_up(timeout_s=0.01, since=49.0))
    assert r.p.stats["replica_catchups_reused"] == 1
    assert r.p.stats["replica_wait_timeouts"] == 0


def test_the_replica_catches_up_for_a_batch_that_arrived_after_its_last_catch_up():
    r = replica()
    r.caught_up_from = 50.0
    assert not asyncio.run(r.caught_up(timeout_s=0.01, since=51.0))  # it tried: no consumer
    assert r.p.stats["replica_wait_timeouts"] == 1
    assert r.caught_up_from == 50.0  # a wait that ran out covers nothing


class Recorder:
    """A replica that records the arrival time each check passes."""

    def __init__(self) -> None:
        self.since: list[float | None] = []

    async def publish(self) -> None:
        pass

    async def caught_up(self, timeout_s=None, since=None) -> bool:
        self.since.append(since)
        return True


def test_the_ops_of_a_batch_pass_the_batch_arrival_time_to_every_check():
    port = Port({("default", "d.md#0"): "1" * 64})
    p, _ = pipeline(port)
    p.replica = rec = Recorder()

    async def batch() -> None:
        with catchup.inputs_from(7.0):
            await handlers.on_prefix_op(p, warm())
            await handlers.on_prefix_op(p, warm())
        await handlers.on_prefix_op(p, warm())  # outside a batch: catch up now

    asyncio.run(batch())
    assert rec.since == [7.0, 7.0, None]
