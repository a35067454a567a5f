"""The worker's KV bookkeeping, pure: which prefixes and blocks are cached, what they cost,
and what goes when; no torch, no Kafka, no HTTP (checked by import-linter).

Like vLLM v1's `KVCacheManager` over its `BlockPool`, `cache.PrefixCache` is the one owner
the runtime and the engines talk to; the rest are its parts. Public surface, by module:

- `cache`: `PrefixCache` (lookup/peek, admit, invalidate by chunk refs or prefix, evict,
  extend_ttl, release, expire, clear; each records `CacheEvent`s the worker drains and
  publishes) and the `WarmupRefused` it raises.
- `entries`: `CacheEntry`, `CacheEvent`, `WarmupRefused`, `Kind`, and which entries and
  blocks a change to chunks reaches (`Stale`, `inferred_start`).
- `block_pool`: `BlockPool`, `ChunkKey`, `PoolStats` — one record per KV block, shared.
- `blocks`: the prefix hashing contract (`BLOCK_SIZE`, `block_hashes`, from `schemas.prefix`).
- `eviction`: the policies by name (`make_policy`, `DEFAULT_POLICY`).
- `memory`, `budgets`, `quota`: byte budgets and tiers, the seed's warmup budget rules,
  the per-tenant quota on warmup-held KV.
- `sizing`: a model's KV bytes per token and the `PrefixCache` a worker builds (`cache_for`).
- `tier_index`, `tier_journal`: the disk tier's block index and what it must do after
  changes to the device cache.
- `chunk_kv`: chunk KV identity and placement for blending held chunks.

Nothing is re-exported here: import from the module that owns a name.
"""
