"""The protocol every inference engine implements and the values its calls return."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, Required, TypedDict, runtime_checkable

from workers.kv.cache import CacheEntry, ChunkKey, PrefixCache
from workers.kv.chunk_kv import ChunkSpan, check_spans
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
    # Of `cached_tokens`, those read from blocks an earlier blended answer stored.
    approx_cached_tokens: int = 0


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


@dataclass(frozen=True)
class GenerateRequest:
    """One `Engine.generate` call: the prompt, how to sample its completion, what to keep.

    Checked when built, so a bad request fails where it is made, not in the engine's
    generator. `stop_ids` None means the model's EOS (an empty tuple: no stop token).

    `chunks` names where the prompt's retrieved chunks stand; an engine holding their chunk
    KV (and with chunk reuse on) blends it after the exact prefix, unless the request opts
    out with `chunk_reuse=False`. Engines without chunk KV ignore them. The prompt's cached
    KV is never modified. With `cache_prompt`, the prompt's full blocks are also stored
    unpinned (with `chunk_refs`, `ttl_s`) without computing them again, unless the cache
    already holds them; a refusal by the budget leaves the answer alone. `result.stored`
    says what was stored; a generation stopped early may have stored it without saying so.
    `seed` makes sampling reproducible where the engine can seed it, `top_k` samples among
    the k likeliest tokens only (synthetic warmup).
    """

    token_ids: Sequence[int]
    max_tokens: int
    tenant: str
    temperature: float = 0.0
    stop_ids: Iterable[int] | None = None
    cache_prompt: bool = False
    chunk_refs: Iterable[ChunkKey] = ()
    ttl_s: float | None = None
    chunks: Sequence[ChunkSpan] = ()
    chunk_reuse: bool = True
    seed: int | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("generate needs at least one prompt token")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        check_spans(self.chunks, len(self.token_ids))
        # Tuples, so the value stays what it was when checked.
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        if self.stop_ids is not None:
            object.__setattr__(self, "stop_ids", tuple(self.stop_ids))
        object.__setattr__(self, "chunk_refs", tuple(self.chunk_refs))
        object.__setattr__(self, "chunks", tuple(self.chunks))


@runtime_checkable
class Engine(Protocol):
    """An LLM that stores prompt prefixes' KV and reuses them to answer faster.

    The engine keeps its bookkeeping in `cache`, which callers read. They change it through
    the engine (`invalidate`, `extend_ttl`, `release`, `expire`, `reset`), which frees the
    KV of what leaves (`sync`); every engine call syncs first. Calls are not thread-safe:
    run one at a time.
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
        chunks: Sequence[ChunkSpan] = (),
        to_tier: bool = False,
    ) -> PrefillResult:
        """Compute and store KV for the block-aligned prefix of `token_ids`.

        `kind="request"` stores it as request caching (evictable, no TTL) rather than
        warmup. `chunks`: where the prompt's chunks stand, when the caller knows; their KV
        is then offered for blending into other prompts at once. `to_tier`: keep it in the
        KV tier below device memory only (`WarmupCommand.placement`). Raises
        `workers.kv.cache.WarmupRefused` when the prefix cannot fit the budget.
        """
        ...

    def generate(self, request: GenerateRequest) -> Iterator[GenerationStep]:
        """Stream a completion of `request`, reusing the longest cached prefix; greedy at
        temperature 0. What each field asks for is said on `GenerateRequest`."""
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
        """Carry out what the cache (the KV manager) planned since the last call
        (`workers.kv.plan.KVPlan`: tier writes and spills, then the KV to free); returns the
        bytes freed. The engines call it after each change; a caller changing `cache`
        itself calls it after."""
        ...

    def reset(self) -> int:
        """Drop every cached prefix and free its KV; returns the bytes freed."""
        ...

    def invalidate(
        self, chunk_refs: Iterable[ChunkKey], *, tenant: str, prefix_hash: str | None = None,
        command_id: str | None = None,
    ) -> list[CacheEntry]:
        """Remove `tenant`'s entries through `chunk_refs`, and those extending one removed or
        `prefix_hash`; frees their KV and returns them."""
        ...

    def extend_ttl(
        self, prefix_hash: str, ttl_s: float | None, *, command_id: str | None = None
    ) -> CacheEntry | None:
        """Extend a managed entry's TTL (None: the cache's default); None if not held."""
        ...

    def release(self, prefix_hash: str, *, command_id: str | None = None) -> CacheEntry | None:
        """Unpin a managed entry, making it evictable; None if not held."""
        ...

    def expire(self) -> list[CacheEntry]:
        """Demote the managed entries past their TTL to evictable ones; returns them."""
        ...

    def memory(self) -> Memory: ...

    def tier_state(self) -> tuple[list[str], int]:
        """Ends of the chains a disk tier below device memory holds, and its bytes."""
        ...

    def tier_total(self) -> int:
        """Bytes that tier may hold (0: none)."""
        ...

    def restore_tier(self, max_bytes: int) -> int:
        """Read the tier's chains back into device memory, most recently used first, within
        `max_bytes`; returns how many (0 without a tier)."""
        ...


class PrefillOptions(TypedDict, total=False):
    """`Engine.prefill`'s keyword arguments, for layers that pass them through unchanged."""

    tenant: Required[str]
    chunk_refs: Iterable[ChunkKey]
    ttl_s: float | None
    pin: bool
    command_id: str | None
    kind: Kind
