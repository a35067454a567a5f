"""Positions after a rebalance: a partition with nothing committed is sought to its beginning,
so records fetched before the rebalance and dropped by Faust are fetched again; and every
seek to the committed offsets does so (Faust also seeks when a fetch returns while the flow
is stopped)."""

from __future__ import annotations

from collections import namedtuple

from streams.shell.rebalance import flow_state, seeking_uncommitted_too, uncommitted

TP = namedtuple("TP", "topic partition")


def test_a_kept_partition_with_nothing_committed_goes_back_to_its_beginning():
    # The --streams 2 stall: partitions 2-3 stayed with the first instance across the
    # rebalance, their first batch still running, so nothing was committed for them.
    assigned = {TP("kb.changes", 2), TP("kb.changes", 3), TP("rag.queries", 2)}
    committed = {TP("kb.changes", 2): None, TP("rag.queries", 2): 40}
    assert uncommitted(assigned, committed, ()) == [TP("kb.changes", 2), TP("kb.changes", 3)]


def test_an_offset_of_zero_counts_as_nothing_committed():
    assert uncommitted({TP("kb.changes", 0)}, {TP("kb.changes", 0): 0}, ()) == [
        TP("kb.changes", 0)
    ]


def test_changelogs_are_left_to_table_recovery():
    assigned = {TP("app-docs-changelog", 0), TP("kb.changes", 0)}
    assert uncommitted(assigned, {}, {"app-docs-changelog"}) == [TP("kb.changes", 0)]


def test_committed_partitions_are_left_to_faust():
    assert uncommitted({TP("kb.changes", 1)}, {TP("kb.changes", 1): 8}, ()) == []


async def test_a_seek_to_the_committed_offsets_also_rewinds_the_uncommitted_partitions():
    kb2, kb3, log0 = TP("kb.changes", 2), TP("kb.changes", 3), TP("app-docs-changelog", 0)
    sought: list[tuple[TP, int]] = []

    async def seek_to_committed() -> dict:
        # aiokafka's: seeks kb.changes 3 to 8 itself, leaves kb.changes 2 where it is.
        sought.append((kb3, 8))
        return {kb2: None, kb3: 8, log0: None}

    async def seek(tp: TP, offset: int) -> None:
        sought.append((tp, offset))

    seek_all = seeking_uncommitted_too(
        seek_to_committed, lambda: {kb2, kb3, log0}, seek, lambda: {"app-docs-changelog"}
    )
    # Faust sets its read offsets from what the seek returns: unchanged.
    assert await seek_all() == {kb2: None, kb3: 8, log0: None}
    assert sought == [(kb3, 8), (kb2, 0)]
    # Every call, not only the first after a rebalance.
    assert await seek_all() == {kb2: None, kb3: 8, log0: None}
    assert sought[2:] == [(kb3, 8), (kb2, 0)]


class _Consumer:
    def __init__(self, flow_active: bool, assigned: int, paused: int) -> None:
        self.flow_active = flow_active
        self._assigned = {TP("t", n) for n in range(assigned)}
        self._paused_partitions = set(list(self._assigned)[:paused])

    def assignment(self):
        return self._assigned


class _App:
    def __init__(self, consumer, rebalancing: bool = False, in_recovery: bool = False) -> None:
        self._consumer, self.rebalancing, self.in_recovery = consumer, rebalancing, in_recovery


def test_flow_state_shows_a_stopped_flow_with_its_partitions():
    state = flow_state(_App(_Consumer(False, 4, 4), rebalancing=True, in_recovery=True))
    assert state == {"flow_active": False, "rebalancing": True, "recovering": True,
                     "assigned": 4, "paused": 4}


def test_flow_state_before_the_consumer_starts():
    assert flow_state(_App(None, rebalancing=True)) == {
        "flow_active": False, "rebalancing": True, "recovering": False, "assigned": 0,
        "paused": 0}
