"""The prefix contract: block-chain hashes of a prompt, the id of its warmable prefix, and
its measures (aligned tokens, KV bytes, a warm hit).

Clients, the streams app, benchmarks and workers all hash prompts with these functions,
so a prefix warmed from a KB event has the hash a later query's prompt starts with.
It lives in `schemas` because that is the one package every side imports.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

BLOCK_SIZE = 16
HASH_CHARS = 32


def root_hash(tenant: str, model: str) -> str:
    """The salt of every chain: two tenants or two models never share a block hash."""
    # JSON keeps the separator unambiguous ("a|b", "c" must differ from "a", "b|c").
    payload = json.dumps(["ragwarm-prefix-v1", tenant, model]).encode()
    return hashlib.sha256(payload).hexdigest()[:HASH_CHARS]


def block_hashes(
    token_ids: Sequence[int], *, tenant: str, model: str, block_size: int = BLOCK_SIZE
) -> list[str]:
    """Chain hashes of the full blocks: h_i = sha256(raw(h_{i-1}) + uint32le(tokens_i)).

    `raw(h)` is the 16 bytes the 32-hex-char hash stands for; h_0's parent is
    `root_hash(tenant, model)`. A trailing partial block is not hashed.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    parent = bytes.fromhex(root_hash(tenant, model))
    packer = struct.Struct(f"<{block_size}I")
    hashes: list[str] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        try:
            data = packer.pack(*block)
        except struct.error as exc:
            raise ValueError(f"token ids must be integers in [0, 2**32): {list(block)}") from exc
        parent = hashlib.sha256(parent + data).digest()[: HASH_CHARS // 2]
        hashes.append(parent.hex())
    return hashes


def aligned_tokens(n_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """The tokens of the full blocks among `n_tokens`: what a worker stores of a prefix
    (a trailing partial block is neither hashed nor kept)."""
    return n_tokens // block_size * block_size


def prefix_kv_bytes(n_tokens: int, kv_bytes_per_token: int, block_size: int = BLOCK_SIZE) -> int:
    """The KV bytes a prefix of `n_tokens` takes on a worker: its full blocks."""
    return aligned_tokens(n_tokens, block_size) * kv_bytes_per_token


def warm_hit(cached_tokens: int, prefix_tokens: int, block_size: int = BLOCK_SIZE) -> bool:
    """Whether a query found its prefix warm: it took every full block of the prefix from
    the cache. A prefix under one block has nothing to warm, so it is never a hit."""
    aligned = aligned_tokens(prefix_tokens, block_size)
    return aligned > 0 and cached_tokens >= aligned


@dataclass(frozen=True)
class PromptChain:
    """The block hashes of a prompt and how many of them lie inside its prefix."""

    hashes: tuple[str, ...]
    prefix_blocks: int

    @property
    def prefix_hashes(self) -> tuple[str, ...]:
        """Hashes of the full blocks of the prefix (what a warmup prefills)."""
        return self.hashes[: self.prefix_blocks]

    @property
    def prefix_hash(self) -> str | None:
        """The prefix's id: the hash of its last full block; None when under one block."""
        return self.hashes[self.prefix_blocks - 1] if self.prefix_blocks else None


def prompt_chain(
    token_ids: Sequence[int],
    prefix_len: int,
    *,
    tenant: str,
    model: str,
    block_size: int = BLOCK_SIZE,
) -> PromptChain:
    """The chain of a prompt whose first `prefix_len` tokens are the warmable prefix.

    The prefix's partial last block is not part of its id: workers store whole blocks,
    so the prefix a worker holds ends at the last block boundary inside it.
    """
    if not 0 <= prefix_len <= len(token_ids):
        raise ValueError(f"prefix_len {prefix_len} outside 0..{len(token_ids)}")
    hashes = block_hashes(token_ids, tenant=tenant, model=model, block_size=block_size)
    return PromptChain(tuple(hashes), prefix_len // block_size)


def prefix_chain(
    prefix_ids: Sequence[int], *, tenant: str, model: str, block_size: int = BLOCK_SIZE
) -> PromptChain:
    """The chain of a prefix on its own (a warmup, which has no question)."""
    return prompt_chain(
        prefix_ids, len(prefix_ids), tenant=tenant, model=model, block_size=block_size
    )


class PromptParams(BaseModel):
    """Everything besides the chunks that decides a canonical prefix's tokens and hashes.

    The streams app publishes these on its health view and the RAG client compares them
    with its own: one differing value turns every warmed prefix into a miss, silently.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str  # the model salt of the hash chain (and the tokenizer it names)
    block_size: int
    top_k: int
    system_prompt_sha256: str  # a digest: the text itself can be long or private

    @classmethod
    def of(cls, *, system_prompt: str, top_k: int, model: str, block_size: int) -> PromptParams:
        digest = hashlib.sha256(system_prompt.encode()).hexdigest()
        return cls(model=model, block_size=block_size, top_k=top_k, system_prompt_sha256=digest)

    def digest(self) -> str:
        """One hash of all the parameters, to compare at a glance."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:HASH_CHARS]

    def differences(self, other: PromptParams) -> list[str]:
        """Names of the parameters whose values differ, in field order."""
        return [name for name in type(self).model_fields
                if getattr(self, name) != getattr(other, name)]
