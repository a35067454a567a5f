"""Positions after a rebalance: a partition with nothing committed is sought to its beginning,
so records fetched before the rebalance and dropped by Faust are fetched again."""

from __future__ import annotations

from collections import namedtuple

from streams.rebalance import uncommitted

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
