"""Unit and property tests for the eviction policies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.kv.eviction import (
    POLICIES,
    GdsfPolicy,
    LfuAgedPolicy,
    LruPolicy,
    SlruPolicy,
    make_policy,
)


def test_registry_and_error() -> None:
    assert set(POLICIES) == {"lru", "slru", "lfu-aged", "gdsf"}
    for name, cls in POLICIES.items():
        policy = make_policy(name)
        assert isinstance(policy, cls) and policy.name == name
    with pytest.raises(ValueError, match="valid names: gdsf, lfu-aged, lru, slru"):
        make_policy("fifo")


def test_lru_order() -> None:
    policy = LruPolicy()
    for key in "abc":
        policy.add(key, nbytes=1, n_tokens=16)
    policy.touch("a")
    policy.touch("zz")  # unknown keys (pinned entries) are ignored
    assert list(policy.order()) == ["b", "c", "a"]
    policy.discard("c")
    policy.discard("missing")
    assert list(policy.order()) == ["b", "a"] and len(policy) == 2 and "a" in policy


def test_slru_evicts_entries_never_hit_again_first() -> None:
    policy = SlruPolicy()
    for key in "abc":
        policy.add(key, nbytes=1, n_tokens=16)
    policy.add("warm", nbytes=1, n_tokens=16, hits=2)  # a warmup that says it is used
    policy.touch("a")  # hit again: goes after every entry never hit
    policy.touch("zz")
    assert list(policy.order()) == ["b", "c", "warm", "a"]
    policy.touch("warm")  # among those hit again: least recently used first
    policy.add("b", nbytes=1, n_tokens=16)  # re-tracked: newest of its segment
    assert list(policy.order()) == ["c", "b", "a", "warm"]
    policy.discard("a")
    policy.discard("missing")
    assert list(policy.order()) == ["c", "b", "warm"] and len(policy) == 3
    assert "warm" in policy and "a" not in policy


def test_lfu_aged_prefers_frequent_then_ages() -> None:
    policy = LfuAgedPolicy()
    policy.add("hot", nbytes=1, n_tokens=16, hits=5)
    policy.add("cold", nbytes=1, n_tokens=16)
    assert list(policy.order()) == ["cold", "hot"]
    policy.discard("cold", evicted=True)
    policy.add("new", nbytes=1, n_tokens=16)
    # Age rose to the victim's priority (1), so a new entry starts at 1 + 1.
    assert policy.priority("new") == 2.0 and policy.priority("hot") == 6.0
    policy.discard("hot", evicted=True)
    policy.add("newer", nbytes=1, n_tokens=16)
    assert list(policy.order()) == ["new", "newer"]
    assert policy.priority("gone") is None


def test_discard_without_eviction_does_not_age() -> None:
    policy = LfuAgedPolicy()
    policy.add("a", nbytes=1, n_tokens=16, hits=9)
    policy.discard("a")
    policy.add("b", nbytes=1, n_tokens=16)
    assert policy.priority("b") == 1.0


def test_gdsf_evicts_big_rarely_used_first() -> None:
    policy = GdsfPolicy()
    policy.add("big", nbytes=1000, n_tokens=16)
    policy.add("small", nbytes=10, n_tokens=16)
    assert list(policy.order()) == ["big", "small"]
    for _ in range(200):
        policy.touch("big")
    assert list(policy.order()) == ["small", "big"]


def test_order_does_not_mutate() -> None:
    policy = GdsfPolicy()
    for i in range(20):
        policy.add(str(i), nbytes=i + 1, n_tokens=16, hits=i % 3)
    assert list(policy.order()) == list(policy.order())
    assert len(policy) == 20


ops = st.lists(
    st.tuples(st.sampled_from(["add", "touch", "discard", "evict"]), st.integers(0, 7)),
    max_size=150,
)


@pytest.mark.parametrize("name", ["lru", "slru"])
@given(ops=ops)
def test_recency_policies_match_a_plain_model(name: str, ops: list[tuple[str, int]]) -> None:
    """LRU is SLRU with every entry in one segment: order by (hit again, last use)."""
    policy = make_policy(name)
    model: dict[str, tuple[bool, int]] = {}  # key -> (hit since stored, last use)
    for t, (op, i) in enumerate(ops):
        key = f"k{i}"
        if op == "add":
            policy.add(key, nbytes=1, n_tokens=16)
            model[key] = (False, t)
        elif op == "touch":
            policy.touch(key)
            if key in model:
                model[key] = (name == "slru", t)
        else:  # discard, evict: the same to a recency policy
            policy.discard(key, evicted=op == "evict")
            model.pop(key, None)
        assert list(policy.order()) == sorted(model, key=model.__getitem__)
        assert len(policy) == len(model) and all(k in policy for k in model)


@pytest.mark.parametrize("name", ["lfu-aged", "gdsf"])
@given(ops=ops)
def test_heap_order_matches_brute_force(name: str, ops: list[tuple[str, int]]) -> None:
    """The lazy heap walk equals sorting (priority, push order) of a plain model."""
    policy = make_policy(name)
    freq: dict[str, int] = {}
    live: dict[str, tuple[float, int]] = {}
    age, pushes = 0.0, 0
    for op, i in ops:
        key, unit = f"k{i}", (16 / (i + 1) if name == "gdsf" else 1.0)
        if op == "add" or (op == "touch" and key in live):
            getattr(policy, op)(key, **({"nbytes": i + 1, "n_tokens": 16} if op == "add" else {}))
            freq[key] = 1 if op == "add" else freq[key] + 1
            live[key] = (age + freq[key] * unit, pushes)
            pushes += 1
        elif op in ("discard", "evict"):
            policy.discard(key, evicted=op == "evict")
            if key in live and op == "evict":
                age = max(age, live[key][0])
            live.pop(key, None)
        expected = sorted(live, key=live.__getitem__)
        assert list(policy.order()) == expected
        assert len(policy) == len(live)
    assert isinstance(policy, LfuAgedPolicy | GdsfPolicy)
    assert all(policy.priority(k) == pytest.approx(live[k][0]) for k in live)
