"""The table-recovery watchdog: an active changelog partition behind its highwater that got
no record for a quiet period is sought again from where its table stands, once per quiet
period, and counted; partitions that are done or still receiving are left alone."""

from __future__ import annotations

from collections import Counter, namedtuple
from types import SimpleNamespace

from streams.shell.recovery_watch import RecoveryWatch, stalled

TP = namedtuple("TP", "topic partition")
DOCS0, DOCS3, HOT3 = TP("app-docs-changelog", 0), TP("app-docs-changelog", 3), TP(
    "app-hot-changelog", 3)


def test_a_quiet_partition_behind_its_highwater_is_sought_after_its_last_record():
    # The takeover stall: docs[0] got nothing since the recovery began (a memory table
    # starts at -1), hot[3] got records up to 2 and then nothing.
    seeks = stalled(
        now=100.0, started_at=50.0, received_at={HOT3: 60.0}, sought_at={},
        offsets={DOCS0: -1, HOT3: 2}, highwaters={DOCS0: 7, HOT3: 9}, quiet_s=30.0,
    )
    assert seeks == {DOCS0: 0, HOT3: 3}


def test_partitions_done_receiving_or_just_sought_are_left_alone():
    offsets = {DOCS0: 7, DOCS3: -1, HOT3: 2}
    highwaters = {DOCS0: 7, DOCS3: 4, HOT3: 9}
    # docs[0] is at its highwater; hot[3] had a record 10 s ago; docs[3] was sought 5 s ago.
    assert stalled(100.0, 50.0, {HOT3: 90.0}, {DOCS3: 95.0}, offsets, highwaters, 30.0) == {}
    # Nor before the quiet period has passed since the recovery began.
    assert stalled(60.0, 50.0, {}, {}, {DOCS3: -1}, {DOCS3: 4}, 30.0) == {}


def test_partitions_without_offsets_or_highwaters_are_not_judged():
    # An empty changelog (highwater -1 at offset -1) is done; None is not built yet.
    assert stalled(100.0, 0.0, {}, {}, {DOCS0: -1, DOCS3: None}, {DOCS0: -1, DOCS3: 4},
                   30.0) == {}
    assert stalled(100.0, 0.0, {}, {}, {DOCS0: -1}, {DOCS0: None}, 30.0) == {}


class FakeConsumer:
    """The few calls of Faust's consumer the watchdog makes, recorded."""

    def __init__(self, fail: bool = False) -> None:
        self.flow_active = True
        self._paused_partitions = {DOCS0}
        self.sought: list[dict] = []
        self.resumed: list[set] = []
        self.fail = fail

    async def position(self, tp: TP) -> int:
        return 7

    def resume_partitions(self, tps: set) -> None:
        self.resumed.append(set(tps))

    async def seek_wait(self, partitions: dict) -> None:
        if self.fail:
            raise RuntimeError("No current assignment for partition")
        self.sought.append(dict(partitions))


def fake_app(consumer: FakeConsumer, started_at: float = 0.0) -> SimpleNamespace:
    recovery = SimpleNamespace(
        in_recovery=True, _recovery_started_at=started_at, _active_events_received_at={},
        active_offsets={DOCS0: -1, DOCS3: 4}, active_highwaters={DOCS0: 7, DOCS3: 4},
        active_tps={DOCS0, DOCS3},
    )
    return SimpleNamespace(tables=SimpleNamespace(recovery=recovery), consumer=consumer)


async def test_the_watch_seeks_once_per_quiet_period_and_counts():
    now = [40.0]
    consumer, stats = FakeConsumer(), Counter()
    watch = RecoveryWatch(fake_app(consumer), 30.0, stats, lambda: now[0])
    assert await watch.check() == {DOCS0: 0}
    assert consumer.sought == [{DOCS0: 0}] and consumer.resumed == [{DOCS0}]
    now[0] = 55.0  # within the quiet period after the seek: left to fetch
    assert await watch.check() == {}
    now[0] = 71.0  # still nothing: sought again, in the same stalled recovery
    assert await watch.check() == {DOCS0: 0}
    assert stats == {"recovery_reseeks": 2, "recovery_stalls": 1}


async def test_a_new_recovery_starts_the_count_again_and_none_running_means_no_seek():
    now = [40.0]
    consumer, stats = FakeConsumer(), Counter()
    app = fake_app(consumer)
    watch = RecoveryWatch(app, 30.0, stats, lambda: now[0])
    await watch.check()
    app.tables.recovery._recovery_started_at = 41.0  # a rebalance restarted the recovery
    now[0] = 72.0
    assert await watch.check() == {DOCS0: 0}
    assert stats == {"recovery_reseeks": 2, "recovery_stalls": 2}
    app.tables.recovery.in_recovery = False
    now[0] = 500.0
    assert await watch.check() == {}


async def test_a_seek_that_fails_is_not_counted_and_is_tried_again():
    consumer, stats = FakeConsumer(fail=True), Counter()
    watch = RecoveryWatch(fake_app(consumer), 30.0, stats, lambda: 40.0)
    assert await watch.check() == {}
    assert stats == {}
    consumer.fail = False
    assert await watch.check() == {DOCS0: 0}
    assert stats == {"recovery_reseeks": 1, "recovery_stalls": 1}
