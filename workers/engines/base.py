"""What the engines share: the prefix bookkeeping, the checks of `generate`, the cache's
mutations that free KV (the protocol itself is `workers.engines.protocol`)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, Unpack

from schemas.prefix import aligned_tokens, prefix_kv_bytes
from workers.engines.protocol import (
    Engine,
    GenerateRequest,
    GenerationStep,
    KeepPrompt,
    Memory,
    PrefillOptions,
    PrefillResult,
)
from workers.kv.blocks import block_hashes
from workers.kv.cache import CacheEntry, ChunkKey, PrefixCache, WarmupRefused
from workers.kv.chunk_kv import (
    ChunkSpan,
    Donor,
    DonorIndex,
    check_spans,
    chunk_prefix,
    held_chunk_tokens,
    plan_pieces,
)
from workers.kv.entries import Kind
from workers.kv.plan import KVPlan
from workers.kv.tier_index import TierIndex


def keep_by_prefill(
    engine: Engine, step: GenerationStep, prompt: Sequence[int], tenant: str, keep: KeepPrompt
) -> GenerationStep:
    """`cache_prompt` for engines whose server caches prompts itself: on the last step,
    record the prompt with `prefill` (its blocks are cached there, so it costs ~1 token)."""
    result, block = step.result, engine.block_size
    if result is None or aligned_tokens(len(prompt), block) <= result.cached_tokens:
        return step  # not the last step, or the cached entry covers every full block
    try:
        stored = engine.prefill(
            prompt, tenant=tenant, chunk_refs=keep.chunk_refs, ttl_s=keep.ttl_s, kind="request"
        )
    except WarmupRefused:
        return step
    if stored.prefix_hash is None:
        return step
    return replace(step, result=replace(result, stored=stored))


@dataclass(frozen=True)
class Request:
    """A `GenerateRequest` as `PrefixEngine._generate` receives it: the prompt as a list and
    what `cache_prompt` keeps."""

    prompt: list[int]
    max_tokens: int
    tenant: str
    temperature: float
    stop_ids: tuple[int, ...] | None
    keep: KeepPrompt | None
    chunks: tuple[ChunkSpan, ...] = ()
    chunk_reuse: bool = True
    seed: int | None = None
    top_k: int | None = None


H = TypeVar("H")


class PrefixEngine(ABC, Generic[H]):
    """What the engines share: tokens, block hashes, the prefill bookkeeping and the checks
    of `generate`. `_held` maps each entry the engine stored to what it holds for it (`H`:
    the KV itself, or only its size where a server keeps the KV); subclasses say how to get
    it (`_prefix_kv`), how big it is (`_held_bytes`) and how to generate (`_generate`).
    """

    model_id: str
    block_size: int
    cache: PrefixCache
    tokenizer: Any
    _held: dict[str, H]
    # A served model (vLLM, a remote server) is warmed by its server when it loads.
    boot_warmup_tokens: int = 0
    # Chunks of the prompts this engine stored, for blending into others (`workers.kv.chunk_kv`);
    # None where the engine holds no KV it could read chunks out of (a server's).
    donors: DonorIndex | None = None

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as is: special tokens only where the text spells them."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, special tokens included (the inverse of `tokenize`)."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def block_hashes(self, token_ids: Sequence[int], *, tenant: str) -> list[str]:
        return block_hashes(
            token_ids, tenant=tenant, model=self.model_id, block_size=self.block_size
        )

    def sync(self) -> int:
        """Carry out what the cache planned since the last call; the bytes of KV freed."""
        return self.apply(self.cache.take_plan())

    def apply(self, plan: KVPlan) -> int:
        """Free what `plan` says: here what is held per prefix (engines keeping KV per block
        or a tier below device memory do more)."""
        return sum(self._held_bytes(self._held.pop(k)) for k in plan.gone if k in self._held)

    def reset(self) -> int:
        # A clean slate for a test or a benchmark step; `sync` so the KV goes with them.
        self.cache.clear()
        if self.donors is not None:
            self.donors.clear()
        return self.sync()

    def invalidate(
        self, chunk_refs: Iterable[ChunkKey], *, tenant: str, prefix_hash: str | None = None,
        command_id: str | None = None,
    ) -> list[CacheEntry]:
        # Only `tenant`'s prefixes: another tenant's identical chunks are not what its edit
        # changed. Entries extending a stale prefix (reactive ones carry no chunk refs) are
        # stale too.
        chunk_refs = list(chunk_refs)
        removed = self.cache.invalidate(chunk_refs, command_id=command_id, tenant=tenant)
        if self.donors is not None:
            # Its blocks may outlive the cut (another prompt holds the same leading blocks):
            # a changed chunk is never blended again, whatever still holds its old KV.
            self.donors.invalidate(chunk_refs, tenant=tenant)
        stale = {e.prefix_hash for e in removed} | ({prefix_hash} if prefix_hash else set())
        for key in sorted(stale):
            removed += self.cache.invalidate_prefix(key, command_id=command_id)
        self.sync()
        return removed

    def extend_ttl(
        self, prefix_hash: str, ttl_s: float | None, *, command_id: str | None = None
    ) -> CacheEntry | None:
        ttl = ttl_s or self.cache.default_ttl_s
        entry = None
        if ttl is not None:
            entry = self.cache.extend_ttl(prefix_hash, ttl, command_id=command_id)
        self.sync()
        return entry

    def release(self, prefix_hash: str, *, command_id: str | None = None) -> CacheEntry | None:
        return self.cache.release(prefix_hash, command_id=command_id)

    def expire(self) -> list[CacheEntry]:
        expired = self.cache.expire()
        self.sync()
        return expired

    @property
    @abstractmethod
    def block_bytes(self) -> int:
        """KV bytes of one full block."""

    def memory(self) -> Memory:
        return Memory(used=self.cache.bytes_used, total=self.cache.budget.max_bytes)

    def tier_state(self) -> tuple[list[str], int]:
        return [], 0  # no disk tier unless an engine keeps one

    def restore_tier(self, max_bytes: int) -> int:
        return 0  # no tier to read back from unless an engine keeps one

    def restorable(self, hashes: list[str], have: int) -> int:
        """Blocks after the first `have` of `hashes` a hit would read back from a disk tier."""
        return 0

    # -- loads from the KV tier ------------------------------------------------------
    # The bookkeeping of a read-back is the same for every engine with a tier, so the
    # model-free engine restores exactly where the torch engine does: `restorable` decides
    # how many blocks, the engine reads them (`_load`), the cache readmits them, then the
    # engine holds what it read (`_place`).

    def _tier_index(self) -> TierIndex | None:
        """The index of the KV tier below device memory; None without one."""
        return None

    def _load(self, hashes: list[str]) -> Sequence[object]:
        """Read `hashes` back from the tier: what the leading ones that read back hold (a
        block that does not ends the run)."""
        return ()

    def _place(self, hashes: Sequence[str], loaded: Sequence[object]) -> None:
        """Hold what `_load` read for `hashes`, which the cache has just readmitted."""

    def _stored_run(self, hashes: list[str]) -> int:
        """How many leading `hashes` of a cached chain the engine holds KV for: all of them,
        unless it keeps KV per block and someone else filled the cache."""
        return len(hashes)

    def _restore(self, hashes: list[str], have: int, tenant: str) -> int:
        """Read the blocks after the first `have` of `hashes` back from the tier when that
        beats recomputing them; how many leading blocks are on the device after it."""
        index = self._tier_index()
        n = self.restorable(hashes, have)
        if index is None or n == 0:
            return have
        loaded = self._load(hashes[have : have + n])
        if not loaded:
            return have
        chain = hashes[: have + len(loaded)]
        if not self._readmit(chain, have, tenant, len(chain) * self.block_bytes, index):
            return have
        self._place(chain[have:], loaded)
        self.sync()  # spills what the admission evicted
        return len(chain)

    def _reusable(self, hashes: list[str], tenant: str) -> tuple[CacheEntry | None, int]:
        """For a request: an entry holding the longest cached chain of `hashes` (whoever
        stored it, on the device or read back from the tier) and how many leading blocks
        the engine holds KV for; counts as a hit."""
        entry, matched = self._lookup(hashes)
        have = self._stored_run(hashes[:matched])
        if have == matched:
            restored = self._restore(hashes, have, tenant)
            if restored > have:
                entry, have = self.cache.get(hashes[restored - 1]), restored
        return (entry, have) if have else (None, 0)

    def _held_run(self, hashes: list[str], tenant: str) -> int:
        """For a warmup: how many leading blocks of `hashes` the engine holds KV for, read
        back from the tier where it can (a peek: a warmup is not a hit and must not reorder
        eviction)."""
        _, matched = self.cache.peek(hashes)
        have = self._stored_run(hashes[:matched])
        return self._restore(hashes, have, tenant) if have == matched else have

    def _readmit(self, chain: list[str], have: int, tenant: str, nbytes: int,
                 index: TierIndex) -> bool:
        """Take the blocks of `chain` after the first `have`, read back from a KV tier, into
        the cache as a request entry (evictable; a warmup may claim them later), each with
        the chunk marks the tier kept, so invalidation finds them on the device; False when
        the cache refuses it."""
        # A blend's blocks come back marked, as they left (`TierBlock.approx`).
        approx_from = next((i for i in range(have, len(chain))
                            if (b := index.get(chain[i])) is not None and b.approx), None)
        try:
            self.cache.admit(tenant=tenant, hashes=chain, nbytes=nbytes, kind="request",
                             approx_from=approx_from)
        except WarmupRefused:
            return False
        for h in chain[have:]:
            held = index.get(h)
            for ref in held.marks if held is not None else ():
                self.cache.pool.mark([h], ref, 0)
        return True

    def prefill(
        self,
        token_ids: Sequence[int],
        *,
        tenant: str,
        chunk_refs: Iterable[ChunkKey] = (),
        ttl_s: float | None = None,
        pin: bool = False,
        command_id: str | None = None,
        kind: Kind = "managed",
        chunks: Sequence[ChunkSpan] = (),
        to_tier: bool = False,
    ) -> PrefillResult:
        # `chunks`: where the chunks stand in the prompt, when the caller knows (then their
        # KV is donated for blending, and invalidation cuts each at its first block).
        check_spans(chunks, len(token_ids) + 1)
        refs = list(chunk_refs)
        tokens = list(token_ids)
        options: PrefillOptions = {
            "tenant": tenant, "chunk_refs": [*refs, *(s.ref for s in chunks if s.ref not in refs)],
            "ttl_s": ttl_s, "pin": pin, "command_id": command_id, "kind": kind,
        }
        if to_tier:
            return self._prefill_to_tier(tokens, tuple(chunks), **options)
        return self._prefill(tokens, tuple(chunks), **options)

    def prefill_chunk(
        self,
        opening: list[int],
        chunk: list[int],
        *,
        tenant: str,
        ref: ChunkKey,
        ttl_s: float | None = None,
        pin: bool = False,
        command_id: str | None = None,
        kind: Kind = "managed",
    ) -> PrefillResult:
        # The prefix `opening + chunk`, marked from the chunk's first token: exactly the
        # leading KV of every prompt that opens with this chunk (`workers.kv.chunk_kv`).
        tokens = chunk_prefix(opening, chunk)
        if held_chunk_tokens(len(opening), len(tokens) // self.block_size, self.block_size) < 1:
            return PrefillResult(None, 0, 0, 0, (), 0.0)  # no full block reaches the chunk
        span = ChunkSpan(ref, len(opening), len(tokens))
        return self._prefill(
            tokens, (span,), tenant=tenant, chunk_refs=[ref], ttl_s=ttl_s,
            pin=pin, command_id=command_id, kind=kind,
        )

    def _prefill(
        self, tokens: list[int], spans: tuple[ChunkSpan, ...],
        **options: Unpack[PrefillOptions],
    ) -> PrefillResult:
        start = time.perf_counter()
        self.sync()
        tenant = options["tenant"]
        hashes = self.block_hashes(tokens, tenant=tenant)
        if not hashes:
            return PrefillResult(None, 0, 0, 0, (), time.perf_counter() - start)
        n_tokens = len(hashes) * self.block_size
        held, computed = self._prefix_kv(tokens[:n_tokens], hashes, tenant)
        entry, evicted = self.cache.admit(
            hashes=hashes, nbytes=self._held_bytes(held),
            chunk_starts={s.ref: s.start for s in spans}, **options
        )
        result = self._record(entry, held, evicted, computed, start)
        self._donate(tenant, tokens, spans, hashes)
        return result

    def _prefill_to_tier(
        self, tokens: list[int], spans: tuple[ChunkSpan, ...],
        **options: Unpack[PrefillOptions],
    ) -> PrefillResult:
        """Compute a prefix for the KV tier below device memory only: its blocks go down as
        an eviction's would, and the prefixes in device memory stay (none is evicted for it;
        it passes the budget only while it is computed). One already in device memory stays
        there, as does one whose blocks a longer prefix holds. Its chunks are not donated:
        their KV leaves the device."""
        if self.cache.tier is None:
            raise WarmupRefused("placement 'tier': this worker keeps no KV tier below device "
                                "memory")
        start = time.perf_counter()
        self.sync()
        tenant = options["tenant"]
        hashes = self.block_hashes(tokens, tenant=tenant)
        if not hashes or self.cache.peek(hashes)[1] == len(hashes):
            return self._prefill(tokens, spans, **options)  # held here: it stays here
        if options.get("pin"):
            raise WarmupRefused("placement 'tier': a prefix kept in the tier cannot be pinned")
        n_tokens = len(hashes) * self.block_size
        held, computed = self._prefix_kv(tokens[:n_tokens], hashes, tenant)
        entry, _ = self.cache.admit(
            hashes=hashes, nbytes=self._held_bytes(held),
            chunk_starts={s.ref: s.start for s in spans}, transient=True, **options
        )
        self._keep(entry, held)
        self.cache.spill(entry.prefix_hash, command_id=options.get("command_id"))
        self.sync()  # writes the blocks to the tier, then frees them here
        elapsed = time.perf_counter() - start
        return PrefillResult(entry.prefix_hash, entry.n_tokens, entry.nbytes, computed, (),
                             elapsed)

    def tier_total(self) -> int:
        """Bytes the KV tier below device memory may hold (0: no tier)."""
        return 0

    def chunk_donors(self, tenant: str, prompt: Sequence[int], spans: Sequence[ChunkSpan],
                     cached: int) -> dict[ChunkKey, Donor]:
        """Per chunk of `prompt` not within its first `cached` tokens, the stored prompt
        holding most of its KV now (stale donors are dropped on the way)."""
        if self.donors is None:
            return {}
        found = {}
        for span in spans:
            if span.end <= cached:
                continue
            chunk = prompt[span.start : span.end]
            donor = self.donors.find(tenant, self.model_id, chunk, self._held_blocks)
            if donor is not None:
                found[span.ref] = donor
        return found

    def chunk_kv_available(self, prompt: Sequence[int], spans: Sequence[ChunkSpan], *,
                           tenant: str, cached: int) -> tuple[int, int]:
        """(tokens of `prompt`'s chunks past its first `cached` that stored prompts hold,
        all its chunk tokens past them): how much of it chunk KV could serve."""
        donors = self.chunk_donors(tenant, prompt, spans, cached)
        plans = plan_pieces(spans, cached, {r: d.held for r, d in donors.items()})
        total = sum(s.end - max(s.start, cached) for s in spans if s.end > cached)
        return sum(p.count for p in plans), total

    def _held_blocks(self, chain: tuple[str, ...]) -> int:
        """Leading blocks of `chain` held here with their exact KV, for a chunk donor (a
        peek: touches nothing). A blend's blocks never donate: blending from them would
        stack one approximation on another."""
        return min(self.cache.peek(chain)[1], self.cache.pool.exact_run(chain))

    def _donate(self, tenant: str, prompt: Sequence[int], spans: Sequence[ChunkSpan],
                hashes: Sequence[str]) -> None:
        """Offer the chunks of a prompt held as `hashes` for blending elsewhere (not from a
        timing trial, which leaves everything as it found it)."""
        if self.donors is not None and spans and self.cache.touching:
            exact = hashes[: self.cache.pool.exact_run(hashes)]  # as `_held_blocks` says
            self.donors.donate(tenant, self.model_id, prompt, spans, exact)

    def generate(self, request: GenerateRequest) -> Iterator[GenerationStep]:
        keep = None
        if request.cache_prompt:
            keep = KeepPrompt(tuple(request.chunk_refs), request.ttl_s)
        stops = tuple(request.stop_ids) if request.stop_ids is not None else None
        return self._generate(Request(
            list(request.token_ids), request.max_tokens, request.tenant, request.temperature,
            stops, keep, tuple(request.chunks), request.chunk_reuse, request.seed, request.top_k,
        ))

    def _lookup(self, hashes: list[str]) -> tuple[CacheEntry | None, int]:
        """The longest cached prefix of `hashes` and its block count; counts as a hit."""
        self.sync()
        found = self.cache.lookup(hashes)
        self.sync()  # lookup may have expired entries
        return found

    def _record(
        self,
        entry: CacheEntry,
        held: H,
        evicted: Iterable[CacheEntry],
        computed: int,
        start: float,
    ) -> PrefillResult:
        """Keep `held` for an entry the cache just admitted; what the prefill stored."""
        self._keep(entry, held)
        self.sync()  # frees what the admission evicted
        elapsed = time.perf_counter() - start
        return PrefillResult(
            entry.prefix_hash, entry.n_tokens, entry.nbytes, computed, tuple(evicted), elapsed
        )

    def _keep(self, entry: CacheEntry, held: H) -> None:
        """Hold what an admitted entry stands for (engines keeping KV per block override it)."""
        self._held[entry.prefix_hash] = held

    @abstractmethod
    def _held_bytes(self, held: H) -> int:
        """Bytes of KV that `held` stands for."""

    @abstractmethod
    def _prefix_kv(self, tokens: list[int], hashes: list[str], tenant: str) -> tuple[H, int]:
        """What to hold for the block-aligned `tokens`, and how many tokens were computed."""

    @abstractmethod
    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        """The steps of a checked request (lazily, or after eager work such as the lookup)."""


class ServerKVEngine(PrefixEngine[int]):
    """An engine whose server keeps the KV in its own block pool (vLLM, an HTTP server).

    Only each entry's size is held here. A warmup is a 1-token request over the prefix,
    which leaves its blocks in the pool; the server cannot drop one prefix, so `sync`
    frees bookkeeping only and the pool's LRU reuses the blocks when it needs room.
    """

    kv_bytes_per_token: int

    def prefill_chunk(
        self,
        opening: list[int],
        chunk: list[int],
        *,
        tenant: str,
        ref: ChunkKey,
        ttl_s: float | None = None,
        pin: bool = False,
        command_id: str | None = None,
        kind: Kind = "managed",
    ) -> PrefillResult:
        # Blending needs the KV itself, which the server keeps. (The prefix `opening + chunk`
        # alone would serve a server too; chunk warmup targets the torch engine for now.)
        raise WarmupRefused(f"{type(self).__name__} holds no chunk KV (chunk reuse needs "
                            "the torch engine)")

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    def _held_bytes(self, held: int) -> int:
        return held

    def _prefix_kv(self, tokens: list[int], hashes: list[str], tenant: str) -> tuple[int, int]:
        computed = 0
        if hashes[-1] not in self._held:
            computed = len(tokens) - self._warm(tokens, tenant)
        return prefix_kv_bytes(len(tokens), self.kv_bytes_per_token, self.block_size), computed

    @abstractmethod
    def _warm(self, tokens: list[int], tenant: str) -> int:
        """Run `tokens` through the server; how many of them it had cached (<= len)."""
