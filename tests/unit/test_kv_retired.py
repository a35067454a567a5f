"""A request computed from a chunk version invalidated while it waited is not cached."""

from __future__ import annotations

import pytest

from tests.unit.cache_kit import chain, make_cache
from workers.kv.cache import WarmupRefused
from workers.kv.entries import Retired

OLD = ("d.md#0", "a" * 64)
NEW = ("d.md#0", "b" * 64)


def test_a_request_naming_a_version_invalidated_before_it_is_not_cached() -> None:
    cache, clock = make_cache()
    cache.invalidate([OLD], tenant="t1")  # the edit's command ran while the request waited
    with pytest.raises(WarmupRefused, match="invalidated while the request waited"):
        cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=64, chunk_refs=[OLD],
                    kind="request")
    assert len(cache) == 0
    # The new version is cached as usual, and the mark lapses after the hold.
    cache.admit(tenant="t1", hashes=chain(3, 4), nbytes=64, chunk_refs=[NEW], kind="request")
    clock.t += cache.retired.hold_s
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=64, chunk_refs=[OLD], kind="request")
    assert len(cache) == 2


def test_a_warm_prefix_of_that_version_is_stored_and_lifts_the_mark() -> None:
    cache, _ = make_cache()
    cache.invalidate([OLD], tenant="t1")
    # The streams app warmed it from its docs table: an edit back to the earlier text.
    cache.admit(tenant="t1", hashes=chain(1, 2), nbytes=64, chunk_refs=[OLD])
    cache.admit(tenant="t1", hashes=chain(1, 2, 3), nbytes=96, chunk_refs=[OLD],
                kind="request")
    assert len(cache) == 2


def test_a_tenants_invalidation_marks_its_own_chunks_only() -> None:
    cache, _ = make_cache()
    cache.invalidate([OLD], tenant="t1")
    cache.admit(tenant="t2", hashes=chain(1, 2, tenant="t2"), nbytes=64, chunk_refs=[OLD],
                kind="request")
    cache.invalidate([OLD])  # no tenant named: every tenant's
    with pytest.raises(WarmupRefused):
        cache.admit(tenant="t2", hashes=chain(5, tenant="t2"), nbytes=32, chunk_refs=[OLD],
                    kind="request")


def test_the_marks_are_bounded_oldest_first() -> None:
    retired = Retired(hold_s=60.0, max_marks=2)
    for i in range(3):
        retired.retire("t", [(f"c{i}", "h")], now=float(i))
    assert len(retired) == 2
    retired.admitting("t", [("c0", "h")], request=True, now=3.0)  # dropped: admitted
    with pytest.raises(WarmupRefused):
        retired.admitting("t", [("c2", "h")], request=True, now=3.0)
