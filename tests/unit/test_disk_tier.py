"""Unit tests for the disk tier's pure parts: its index (budget, subtrees, chunk marks, LRU),
the restore cost rule, and the journal the device cache keeps for it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.cache_kit import chain, make_cache
from workers.kv.tier_index import RestoreCosts, TierBlock, TierIndex
from workers.kv.tier_journal import TierJournal

REF = ("doc#1", "aa")
OTHER = ("doc#2", "bb")


def blocks_of(hashes: list[str], nbytes: int = 10, marks=frozenset(), first: int = 0):
    return [
        TierBlock(h, hashes[i - 1] if i else None, "t1", nbytes, frozenset(marks) if i >= first
                  else frozenset())
        for i, h in enumerate(hashes)
    ]  # fmt: skip


def filled(hashes: list[str], max_bytes: int = 1000, **kw) -> TierIndex:
    index = TierIndex(max_bytes)
    for block in blocks_of(hashes, **kw):
        index.add(block)
    return index


def test_a_run_counts_the_leading_blocks_held_from_a_start() -> None:
    c = chain(1, 2, 3, 4)
    index = filled(c[1:3])
    assert index.run(c) == 0
    assert index.run(c, 1) == 2
    assert index.chain_ends() == [c[2]]


def test_removing_a_block_removes_every_block_extending_it_even_when_it_is_not_held() -> None:
    a, b = chain(1, 2, 3), chain(1, 2, 4, 5)
    index = filled(a)
    for block in blocks_of(b)[2:]:
        index.add(block)
    # Block 1 is on the device only; cutting it must still clear both tails from disk.
    index.remove([a[0]])
    assert len(index) == 0 and index.bytes_used == 0


def test_invalidating_a_chunk_drops_its_marked_blocks_and_what_extends_them() -> None:
    c = chain(1, 2, 3, 4)
    index = filled(c, marks={REF}, first=2)
    other = filled([])
    assert index.invalidate([OTHER]) == [] and len(index) == 4
    assert sorted(index.invalidate([REF])) == sorted(c[2:])
    assert index.chain_ends() == [c[1]]
    other = filled(c, marks={REF}, first=1)
    assert len(other.invalidate(chunk_ids=["doc#1"])) == 3


def test_the_least_recently_used_leaves_go_first() -> None:
    a, b = chain(1, 2), chain(3, 4)
    index = filled(a, max_bytes=40)
    for block in blocks_of(b):
        index.add(block)
    index.touch(a)
    evicted = index.add(TierBlock(chain(5)[0], None, "t1", 10))
    assert evicted == [b[1]]  # b's leaf, not its head
    assert index.bytes_used == 40


def test_a_boot_restores_whole_chains_most_recently_used_first_within_its_bytes() -> None:
    a, b, c = chain(1, 2, 3), chain(1, 2, 4), chain(5, 6)
    index = filled(a)
    for block in [*blocks_of(b)[2:], *blocks_of(c)]:
        index.add(block)
    index.touch(c)
    index.touch(a)  # a, then c, then b
    assert index.restore_plan(1000) == [a, c, b]
    # b shares a's head: it costs one block more, so it fits where c (two blocks) does not.
    assert index.restore_plan(40) == [a, b]
    assert index.restore_plan(20) == [c]
    assert index.restore_plan(10) == []


def test_a_prefix_that_a_longer_one_extends_is_restored_as_its_own_prefix() -> None:
    short, long = chain(1, 2), chain(1, 2, 3)
    index = filled(long)
    assert index.prefix_ends() == [long[-1]]
    index.add(TierBlock(short[-1], short[0], "t1", 10, end=True))  # a cached prefix ends here
    assert sorted(index.prefix_ends()) == sorted([short[-1], long[-1]])
    assert sorted(index.restore_plan(1000)) == sorted([short, long])
    assert index.restore_plan(20) == [short]  # the long one needs a third block


def test_a_journaled_prefix_marks_where_it_ends() -> None:
    cache, _ = journaled()
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=30)
    assert cache.tier is not None
    writes = cache.tier.drain().writes
    assert [b.end for b in writes.values()] == [False, False, True]


def test_a_chain_whose_head_is_not_in_the_tier_is_not_restored() -> None:
    c = chain(1, 2, 3)
    index = filled([])
    for block in blocks_of(c)[1:]:  # its head stayed on the device, which a restart emptied
        index.add(block)
    assert index.chain(c[-1]) is None
    assert index.restore_plan(1000) == []


def test_a_second_estimate_narrows_a_held_blocks_marks() -> None:
    c = chain(1)
    index = filled(c, marks={REF, OTHER})
    assert index.narrow(c[0], {REF})
    assert not index.narrow(c[0], {REF, OTHER})
    assert index.invalidate([OTHER]) == []
    assert index.invalidate([REF]) == c


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(1, 30)), max_size=40),
       st.integers(0, 120))  # fmt: skip
def test_bytes_never_exceed_the_budget(ops: list[tuple[int, int, int]], budget: int) -> None:
    index = TierIndex(budget)
    for root, length, nbytes in ops:
        hashes = chain(*[root * 10 + i for i in range(length)])
        for block in blocks_of(hashes, nbytes=nbytes):
            if index.admissible(block.nbytes):
                index.add(block)
            assert index.bytes_used <= budget
            assert index.bytes_used == sum(index.get(h).nbytes for h in list(index._blocks))


def test_restoring_is_chosen_only_while_it_beats_recomputing() -> None:
    costs = RestoreCosts()
    assert costs.worth_restoring(16, 10**9)  # nothing measured yet: try the tier
    costs.saw_compute(1000, 1.0)  # 1 ms a token
    costs.saw_read(10**9, 1.0)  # 1 ns a byte
    assert costs.worth_restoring(16, 10**6)  # 1 ms to read against 16 ms to compute
    assert not costs.worth_restoring(16, 10**8)


def journaled(**kw):
    cache, clock = make_cache(**kw)
    cache.tier = TierJournal()
    return cache, clock


def test_a_warm_prefix_is_written_through_and_a_request_one_is_not() -> None:
    cache, _ = journaled()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True, chunk_refs=[REF])
    cache.admit(tenant="t1", hashes=chain(1, 3), nbytes=20, kind="request")
    ops = cache.tier.drain()
    assert list(ops.writes) == chain(1, 2)
    assert ops.writes[chain(1, 2)[1]].parent == chain(1)[0]
    assert not cache.tier.drain()


def test_blocks_evicted_for_room_spill_with_their_chunk_marks() -> None:
    cache, _ = journaled(max_bytes=40)
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, kind="request", chunk_refs=[REF])
    cache.admit(tenant="t1", hashes=chain(1, 3), nbytes=20, kind="request", chunk_refs=[OTHER])
    cache.tier.drain()
    cache.admit(tenant="t1", hashes=chain(4, 5), nbytes=20, kind="request")
    ops = cache.tier.drain()
    # The oldest entry left; its unshared block spills. Block 1 is shared by an entry that
    # does not list REF, so REF starts after it.
    assert list(ops.spills) == [chain(1, 2)[1]] and not ops.writes
    assert ops.spills[chain(1, 2)[1]].marks == {REF}


def test_a_chunk_seen_with_nothing_before_it_marks_the_whole_chain() -> None:
    cache, _ = journaled()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True, chunk_refs=[REF])
    ops = cache.tier.drain()
    assert all(b.marks == {REF} for b in ops.writes.values())


def test_invalidation_tells_the_tier_what_is_stale_and_cancels_its_writes() -> None:
    cache, _ = journaled()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True, chunk_refs=[REF])
    cache.invalidate([REF])
    ops = cache.tier.drain()
    assert ops.refs == {(None, REF)}  # (tenant: every tenant, chunk)
    assert chain(1)[0] in ops.cut and not ops.writes
    cache.invalidate_chunks(["doc#9"])
    assert cache.tier.drain().chunk_ids == {"doc#9"}


def test_a_restarted_worker_with_a_disk_tier_is_routed_to_for_what_it_kept() -> None:
    from schemas import WorkerEvent
    from streams.decide.fleet import apply_worker_event, choose_worker

    kept = chain(1, 2)
    before = apply_worker_event(None, WorkerEvent(worker_id="w", kind="ready", epoch=1), 0.0)
    after = apply_worker_event(
        before,
        WorkerEvent(worker_id="w", kind="ready", epoch=2, tier_prefixes=[kept[-1]],
                    mem_total_bytes=100),
        1.0,
    )  # fmt: skip
    assert after.epoch == 2 and after.prefixes == [kept[-1]]
    assert choose_worker([after], kept) == "w"


def test_a_warm_prefix_sharing_a_head_narrows_the_heads_marks() -> None:
    cache, _ = journaled()
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=20, pin=True, chunk_refs=[REF])
    first = cache.tier.drain()
    assert first.writes[chain(1)[0]].marks == {REF}  # nothing yet says where REF starts
    cache.admit(tenant="t1", hashes=chain(1, 3), nbytes=20, pin=True, chunk_refs=[OTHER])
    second = cache.tier.drain()
    # Block 1 is shared with an entry listing REF only: OTHER starts after it, and a tier
    # holding block 1 marked REF keeps only what both estimates say: nothing.
    assert second.writes[chain(1)[0]].marks == frozenset()
    index = TierIndex(1000)
    for block in first.writes.values():
        index.add(block)
    for block in second.writes.values():
        index.add(block)
    assert sorted(index.invalidate([REF])) == [chain(1, 2)[1]]
