"""KV tensors per block for the torch engine: cut a request's KV into blocks, join them back.

Each block owns one contiguous tensor [2 × layers, kv_heads, block, head_dim] (so freeing a
block frees its memory) and keeps per-layer views of it. A request's past is joined from
its blocks with ONE `torch.cat` over every layer at once: on a GPU, per-layer joins of
thousands of block views cost more host time than the suffix's forward itself (32k tokens
on an H200: 79 ms warm against a 26 ms floor), while one call over whole blocks is one
kernel and one list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Per layer (keys, values), each [1, kv_heads, tokens, head_dim]; never modified once stored.
KV = tuple[tuple[torch.Tensor, torch.Tensor], ...]


def resolve_kv_dtype(name: str, compute: torch.dtype) -> torch.dtype:
    """The precision blocks are stored in: `auto` is float16 under a float32 model (its KV
    rounds to the same answers: docs/results.md, `bench kv-precision`), else the model's."""
    if name == "auto":
        return torch.float16 if compute == torch.float32 else compute
    return getattr(torch, name)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class BlockKV:
    """One block's KV: per-layer views (each [1, kv_heads, block, head_dim]) of one tensor."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    nbytes: int
    data: torch.Tensor  # [2 * layers, kv_heads, block, head_dim]: keys and values interleaved


def cut_blocks(
    kv: KV, first: int, count: int, block_size: int, dtype: torch.dtype | None = None
) -> list[BlockKV]:
    """Blocks `first .. first+count-1` of `kv`, copied out so they outlive the request, in
    `dtype` (the store's precision; None: as computed)."""
    start, stop = first * block_size, (first + count) * block_size
    with torch.inference_mode():
        # One stack over every layer's keys and values, then one copy per block.
        seg = torch.stack([t[0, :, start:stop, :] for pair in kv for t in pair])
        seg = seg.unflatten(2, (count, block_size))  # [2 * layers, heads, count, block, dim]
        if dtype is not None and dtype != seg.dtype:
            seg = seg.to(dtype)  # one rounding pass for the whole run, not one per block
        # A clone per block: each owns its storage, so freeing one frees its bytes.
        return [as_block(seg[:, :, i].clone()) for i in range(count)]


def as_block(data: torch.Tensor) -> BlockKV:
    """A block over `data` ([2 × layers, kv_heads, block, head_dim]), viewed per layer."""
    views = data.unsqueeze(1).unbind(0)  # 2 * layers views of [1, heads, block, dim]
    return BlockKV(keys=views[0::2], values=views[1::2], nbytes=data.nbytes, data=data)


class ChainLayer(DynamicLayer):
    """A cache layer whose past is a list of block views, joined with the first new tokens
    in the one `torch.cat` a plain layer does anyway, so the blocks are copied only once."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], length: int) -> None:
        super().__init__()
        self.lazy_initialization(keys[0], values[0])
        self._parts: tuple[list[torch.Tensor], list[torch.Tensor]] | None = (keys, values)
        self._length = length

    def get_seq_length(self) -> int:
        return self._length if self._parts is not None else super().get_seq_length()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._parts is None:
            return super().update(key_states, value_states, *args, **kwargs)
        keys, values = self._parts
        self._parts = None
        self.keys = torch.cat([*keys, key_states], dim=-2)
        self.values = torch.cat([*values, value_states], dim=-2)
        return self.keys, self.values


def chain_cache(
    config: Any, blocks: Sequence[BlockKV], n_tokens: int, dtype: torch.dtype | None = None
) -> DynamicCache:
    """A fresh request cache whose past is the first `n_tokens` of `blocks`, in `dtype` (the
    model's, where blocks are stored in another precision)."""
    past = DynamicCache(config=config)
    if not blocks or n_tokens == 0:
        return past
    block_size = blocks[0].data.shape[-2]
    used = blocks[: -(-n_tokens // block_size)]
    with torch.inference_mode():
        joined = torch.cat([b.data for b in used], dim=-2)[..., :n_tokens, :]
        if dtype is not None and dtype != joined.dtype:
            joined = joined.to(dtype)
    for i in range(len(past.layers)):
        keys, values = joined[2 * i].unsqueeze(0), joined[2 * i + 1].unsqueeze(0)
        past.layers[i] = ChainLayer([keys], [values], n_tokens)
    return past


def join(blocks: Sequence[BlockKV], dtype: torch.dtype | None = None) -> KV:
    """The blocks' KV as one contiguous tensor per layer (a copy), in `dtype` (None: as
    stored)."""
    with torch.inference_mode():
        data = torch.cat([b.data for b in blocks], dim=-2)
        if dtype is not None and dtype != data.dtype:
            data = data.to(dtype)
        views = data.unsqueeze(1).unbind(0)
        return tuple(zip(views[0::2], views[1::2], strict=True))
