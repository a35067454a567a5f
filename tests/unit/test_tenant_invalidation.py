"""An invalidation command is scoped to its tenant: chunk ids and text repeat across tenants
(two tenants indexing the same document), and one tenant's edit must not evict the other's
prefixes, neither from the device cache nor from the disk tier."""

from __future__ import annotations

from tests.unit.cache_kit import chain, make_cache
from workers.kv.tier_index import TierBlock, TierIndex
from workers.kv.tier_journal import TierJournal

REF = ("d#0", "aa")  # the same chunk in both tenants' KBs


def two_tenants():
    cache, _ = make_cache()
    acme, _ = cache.admit(tenant="acme", hashes=chain(1, 2, tenant="acme"), nbytes=1,
                          chunk_refs=[REF])
    globex, _ = cache.admit(tenant="globex", hashes=chain(1, 2, tenant="globex"), nbytes=1,
                            chunk_refs=[REF])
    return cache, acme, globex


def test_a_tenants_invalidation_leaves_another_tenants_identical_prefix():
    cache, acme, globex = two_tenants()
    assert cache.invalidate([REF], tenant="acme") == [acme]
    assert cache.lookup(chain(1, 2, tenant="globex"))[0] == globex
    assert cache.lookup(chain(1, 2, tenant="acme")) == (None, 0)


def test_an_invalidation_with_no_tenant_still_reaches_every_tenant():
    cache, acme, globex = two_tenants()
    assert sorted(e.prefix_hash for e in cache.invalidate([REF])) == sorted(
        [acme.prefix_hash, globex.prefix_hash])


def test_a_chunk_placed_in_the_chain_is_cut_for_its_tenant_only():
    cache, _ = make_cache()
    # Marked at admission (the chunk starts at block 1): exact blocks, from the pool's marks.
    for tenant in ("acme", "globex"):
        cache.admit(tenant=tenant, hashes=chain(1, 2, 3, tenant=tenant), nbytes=1,
                    chunk_refs=[REF], chunk_starts={REF: 1})
    removed = cache.invalidate([REF], tenant="globex")
    assert [e.tenant for e in removed] == ["globex"]
    assert cache.lookup(chain(1, 2, 3, tenant="acme"))[1] == 3


def test_the_disk_tier_drops_the_tenants_blocks_only():
    index = TierIndex(1000)
    for tenant in ("acme", "globex"):
        (h,) = chain(1, tenant=tenant)
        index.add(TierBlock(h, None, tenant, 10, frozenset({REF})))
    assert index.invalidate([REF], tenant="acme") == chain(1, tenant="acme")
    assert len(index) == 1
    assert index.invalidate([REF]) == chain(1, tenant="globex")  # no tenant: every one


def test_the_tier_journal_keeps_the_tenant_of_what_it_must_drop():
    cache, _ = make_cache()
    journal = TierJournal()
    cache.tier = journal
    cache.admit(tenant="acme", hashes=chain(1, tenant="acme"), nbytes=1, chunk_refs=[REF])
    cache.invalidate([REF], tenant="acme")
    assert journal.drain().refs == {("acme", REF)}
