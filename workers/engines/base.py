"""The protocol every inference engine implements, and the results it returns."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from workers.cache import CacheEntry, ChunkKey, PrefixCache, WarmupRefused


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
    ) -> PrefillResult:
        """Compute and store KV for the block-aligned prefix of `token_ids`.

        Raises `workers.cache.WarmupRefused` when the prefix cannot fit the budget.
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
    ) -> Iterator[GenerationStep]:
        """Stream a completion, reusing the longest cached prefix; greedy at temperature 0.

        The prompt's cached KV is never modified. `stop_ids` defaults to the model's EOS.
        With `cache_prompt`, the prompt's full blocks are also stored unpinned (with
        `chunk_refs`, `ttl_s`) without computing them again, unless the cache already holds
        them; a refusal by the budget leaves the answer alone. `result.stored` says what was
        stored; a generation stopped early may have stored it without saying so.
        """
        ...

    def sync(self) -> int:
        """Free the KV of entries the cache no longer holds; returns the bytes freed."""
        ...

    def memory(self) -> Memory: ...


def keep_by_prefill(
    engine: Engine, step: GenerationStep, prompt: Sequence[int], tenant: str, keep: KeepPrompt
) -> GenerationStep:
    """`cache_prompt` for engines whose server caches prompts itself: on the last step,
    record the prompt with `prefill` (its blocks are cached there, so it costs ~1 token)."""
    result, block = step.result, engine.block_size
    if result is None or len(prompt) // block * block <= result.cached_tokens:
        return step  # not the last step, or the cached entry covers every full block
    try:
        stored = engine.prefill(prompt, tenant=tenant, chunk_refs=keep.chunk_refs, ttl_s=keep.ttl_s)
    except WarmupRefused:
        return step
    if stored.prefix_hash is None:
        return step
    return replace(step, result=replace(result, stored=stored))
