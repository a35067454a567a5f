"""The protocol every inference engine implements, its results, and the engines' shared part."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import (
    Any,
    Generic,
    Literal,
    NamedTuple,
    Protocol,
    Required,
    TypedDict,
    TypeVar,
    Unpack,
    runtime_checkable,
)

from schemas.prefix import aligned_tokens, prefix_kv_bytes
from workers.kv.blocks import block_hashes
from workers.kv.cache import CacheEntry, ChunkKey, PrefixCache, WarmupRefused
from workers.kv.chunk_kv import ChunkSpan, check_spans, chunk_prefix, held_chunk_tokens
from workers.kv.entries import Kind


class Memory(NamedTuple):
    """KV memory of an engine: bytes held by cached prefixes, and the most it may hold."""

    used: int
    total: int


@dataclass(frozen=True)
class PrefillResult:
    """What a prefill stored: the block-aligned prefix, its size and what it pushed out."""

    prefix_hash: str | None  # None when the prompt is shorter than one block
    n_tokens: int  # tokens stored, a multiple of the block size
    nbytes: int
    computed_tokens: int  # tokens run through the model; 0 when it was already cached
    evicted: tuple[CacheEntry, ...]
    elapsed_s: float


@dataclass(frozen=True)
class GenerationResult:
    """A finished generation: its tokens and text, and how much of the prompt was cached."""

    token_ids: tuple[int, ...]  # completion tokens, without the stop token
    text: str
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the cache
    prefix_hash: str | None  # the cached entry used, if any
    ttft_s: float
    total_s: float
    finish_reason: Literal["stop", "length"]
    # What `cache_prompt` stored; None when not asked, already cached, too short or refused.
    stored: PrefillResult | None = None
    # Prompt tokens whose KV came from held chunk KV placed at their positions (blended).
    blended_tokens: int = 0


@dataclass(frozen=True)
class GenerationStep:
    """One generated token; `text` is its decoded delta, `result` is set on the last step."""

    index: int
    token_id: int
    text: str
    result: GenerationResult | None = None


@dataclass(frozen=True)
class KeepPrompt:
    """How `generate(cache_prompt=True)` stores the prompt: its chunk refs and TTL."""

    chunk_refs: tuple[ChunkKey, ...] = ()
    ttl_s: float | None = None


@runtime_checkable
class Engine(Protocol):
    """An LLM that stores prompt prefixes' KV and reuses them to answer faster.

    The engine keeps its bookkeeping in `cache`. Callers may remove entries through the
    cache directly (invalidate, evict, expire, clear); `sync()` then frees their KV, and
    every engine call syncs first. Calls are not thread-safe: run one at a time.
    """

    model_id: str
    device: str
    block_size: int
    cache: PrefixCache
    # Prompt tokens of the throwaway request the worker runs before `ready` (workers.boot);
    # 0: nothing to warm (the engine loads no weights of its own, or the setting is off).
    boot_warmup_tokens: int

    @property
    def max_model_len(self) -> int:
        """Most tokens (prompt + completion) one sequence may hold."""
        ...

    @property
    def vocab_size(self) -> int:
        """Valid token ids are `0 <= id < vocab_size`."""
        ...

    @property
    def kv_bytes_per_token(self) -> int: ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    def block_hashes(self, token_ids: Sequence[int], *, tenant: str) -> list[str]:
        """Chain hashes of the full blocks, salted with `tenant` and `model_id`."""
        ...

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
    ) -> PrefillResult:
        """Compute and store KV for the block-aligned prefix of `token_ids`.

        `kind="request"` stores it as request caching (evictable, no TTL) rather than
        warmup. Raises `workers.kv.cache.WarmupRefused` when the prefix cannot fit the budget.
        """
        ...

    def generate(
        self,
        token_ids: Sequence[int],
        *,
        max_tokens: int,
        tenant: str,
        temperature: float = 0.0,
        stop_ids: Iterable[int] | None = None,
        cache_prompt: bool = False,
        chunk_refs: Iterable[ChunkKey] = (),
        ttl_s: float | None = None,
        chunks: Sequence[ChunkSpan] = (),
        chunk_reuse: bool = True,
        seed: int | None = None,
        top_k: int | None = None,
    ) -> Iterator[GenerationStep]:
        """Stream a completion, reusing the longest cached prefix; greedy at temperature 0.

        `chunks` names where the prompt's retrieved chunks stand; an engine holding their
        chunk KV (and with chunk reuse on) blends it after the exact prefix, unless the
        request opts out with `chunk_reuse=False`. Engines without chunk KV ignore them.

        The prompt's cached KV is never modified. `stop_ids` defaults to the model's EOS.
        With `cache_prompt`, the prompt's full blocks are also stored unpinned (with
        `chunk_refs`, `ttl_s`) without computing them again, unless the cache already holds
        them; a refusal by the budget leaves the answer alone. `result.stored` says what was
        stored; a generation stopped early may have stored it without saying so. `seed`
        makes sampling reproducible where the engine can seed it, `top_k` samples among
        the k likeliest tokens only (synthetic warmup).
        """
        ...

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
        """Compute and store the KV of `chunk` right after `opening` (the system prompt) as
        the prefix `opening + chunk` (`workers.kv.chunk_kv`): any prompt opening with the chunk
        reuses it exactly, and an engine with chunk reuse can blend it elsewhere. Invalidated
        by `ref`. Raises `WarmupRefused` where the engine holds no chunk KV or it cannot fit."""
        ...

    def sync(self) -> int:
        """Free the KV of entries the cache no longer holds; returns the bytes freed."""
        ...

    def reset(self) -> int:
        """Drop every cached prefix and free its KV; returns the bytes freed."""
        ...

    def memory(self) -> Memory: ...

    def tier_state(self) -> tuple[list[str], int]:
        """Ends of the chains a disk tier below device memory holds, and its bytes."""
        ...


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


class PrefillOptions(TypedDict, total=False):
    """`Engine.prefill`'s keyword arguments, for layers that pass them through unchanged."""

    tenant: Required[str]
    chunk_refs: Iterable[ChunkKey]
    ttl_s: float | None
    pin: bool
    command_id: str | None
    kind: Kind


@dataclass(frozen=True)
class Request:
    """One checked `generate` call, as `PrefixEngine._generate` receives it."""

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
        stale = [key for key in self._held if key not in self.cache]
        return sum(self._held_bytes(self._held.pop(key)) for key in stale)

    def reset(self) -> int:
        # A clean slate for a test or a benchmark step; `sync` so the KV goes with them.
        self.cache.clear()
        return self.sync()

    def memory(self) -> Memory:
        return Memory(used=self.cache.bytes_used, total=self.cache.budget.max_bytes)

    def tier_state(self) -> tuple[list[str], int]:
        return [], 0  # no disk tier unless an engine keeps one

    def restorable(self, hashes: list[str], have: int) -> int:
        """Blocks after the first `have` of `hashes` a hit would read back from a disk tier."""
        return 0

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
    ) -> PrefillResult:
        return self._prefill(
            list(token_ids), {}, tenant=tenant, chunk_refs=chunk_refs, ttl_s=ttl_s, pin=pin,
            command_id=command_id, kind=kind,
        )

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
        return self._prefill(
            tokens, {ref: len(opening)}, tenant=tenant, chunk_refs=[ref], ttl_s=ttl_s,
            pin=pin, command_id=command_id, kind=kind,
        )

    def _prefill(
        self, tokens: list[int], chunk_starts: dict[ChunkKey, int],
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
            hashes=hashes, nbytes=self._held_bytes(held), chunk_starts=chunk_starts, **options
        )
        return self._record(entry, held, evicted, computed, start)

    def generate(
        self,
        token_ids: Sequence[int],
        *,
        max_tokens: int,
        tenant: str,
        temperature: float = 0.0,
        stop_ids: Iterable[int] | None = None,
        cache_prompt: bool = False,
        chunk_refs: Iterable[ChunkKey] = (),
        ttl_s: float | None = None,
        chunks: Sequence[ChunkSpan] = (),
        chunk_reuse: bool = True,
        seed: int | None = None,
        top_k: int | None = None,
    ) -> Iterator[GenerationStep]:
        # Checked here, not in a generator, so bad arguments fail at the call.
        if not token_ids:
            raise ValueError("generate needs at least one prompt token")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        stops = tuple(stop_ids) if stop_ids is not None else None
        keep = KeepPrompt(tuple(chunk_refs), ttl_s) if cache_prompt else None
        check_spans(chunks, len(token_ids))
        request = Request(
            list(token_ids), max_tokens, tenant, temperature, stops, keep, tuple(chunks),
            chunk_reuse, seed, top_k,
        )
        return self._generate(request)

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
