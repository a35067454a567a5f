"""The protocol every inference engine implements, and the results it returns."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from workers.cache import CacheEntry, ChunkKey, PrefixCache


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


@dataclass(frozen=True)
class GenerationStep:
    """One generated token; `text` is its decoded delta, `result` is set on the last step."""

    index: int
    token_id: int
    text: str
    result: GenerationResult | None = None


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
    ) -> Iterator[GenerationStep]:
        """Stream a completion, reusing the longest cached prefix; greedy at temperature 0.

        The prompt's cached KV is never modified. `stop_ids` defaults to the model's EOS.
        """
        ...

    def sync(self) -> int:
        """Free the KV of entries the cache no longer holds; returns the bytes freed."""
        ...

    def memory(self) -> Memory: ...
