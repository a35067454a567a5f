"""Chunk-level KV reuse: one prompt's cache assembled from chunk KV computed elsewhere, with a
share of the tokens recomputed to restore the attention between chunks (CacheBlend, EPIC)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from transformers import DynamicCache

from workers.engines.rope import inv_freq, rotate_half, shift_keys
from workers.kv.blend_cost import check_shares

# Per layer (keys, values), each [1, kv_heads, tokens, head_dim].
LayerKV = tuple[torch.Tensor, torch.Tensor]
KV = tuple[LayerKV, ...]

# Scored selections rank moved tokens at the check layer: `hkvd` by how far their reused KV
# is from a full computation (CacheBlend), `attn` by the attention the question pays them
# (ProphetKV-style); `sink` takes each moved piece's first tokens (EPIC's attention sinks);
# `tail` takes the last moved piece whole (the question's neighbour), then the others' first.
SCORES = ("hkvd", "attn")
SELECTORS = ("hkvd", "attn", "sink", "sink+hkvd", "sink+attn", "tail")


@dataclass(frozen=True)
class Piece:
    """KV of the prompt tokens [start, start + length), computed with its first token at
    position `computed_at` (a chunk computed after the system prompt: its length).

    `in_context`: it was computed after exactly the prompt's tokens before it, so it is never
    recomputed (a chunk computed after the chunk that precedes it here too). None: inferred
    from the positions, which is right for chunks computed after the system prompt alone.
    """

    start: int
    kv: KV
    computed_at: int
    in_context: bool | None = None

    @property
    def settled(self) -> bool:
        return self.computed_at == self.start if self.in_context is None else self.in_context

    @property
    def length(self) -> int:
        return int(self.kv[0][0].shape[-2])

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class Selection:
    """Which of the moved tokens to recompute, and how many.

    `share` is the share of moved tokens (placed elsewhere than where they were computed)
    recomputed through the last layer. `hkvd` ranks them by how far their KV deviates from
    a full computation (CacheBlend); `sink` takes each moved piece's first tokens (EPIC's
    attention sinks at chunk boundaries); `sink+hkvd` takes `sink_tokens` of each piece's
    first tokens and fills the rest of the share by deviation.

    Scored tokens are filtered gradually, as CacheBlend does: every moved token runs up to
    the first of `checks`, and at each check the best are kept, `widen` × share at the
    first narrowing to share at the last (deviation at deeper layers predicts better, and
    costs more). `tail` recomputes the last moved piece (next to the question) from its
    start, then the other moved pieces' first tokens, within the share.
    """

    # Defaults: the best quality measured within ~35% of a full prefill's TTFT (bench blend).
    method: str = "hkvd"
    share: float = 0.3
    sink_tokens: int = 4
    checks: tuple[int, ...] = (1, 4, 10)
    widen: float = 2.0

    def __post_init__(self) -> None:
        if self.method not in SELECTORS:
            raise ValueError(f"unknown selection {self.method!r}; valid: {', '.join(SELECTORS)}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must be within [0, 1], not {self.share}")
        if not self.checks or list(self.checks) != sorted(set(self.checks)) or self.widen < 1:
            raise ValueError("checks must be increasing layer numbers and widen >= 1")

    def kept(self, moved: int) -> dict[int, int]:
        """Moved tokens kept after each check layer (the last one keeps the share)."""
        shares = check_shares(self.share, len(self.checks), self.widen)
        return {layer: min(moved, math.ceil(s * moved)) for layer, s in zip(
            self.checks, shares, strict=True)}


@dataclass(frozen=True)
class BlendResult:
    """The logits of the last prompt token and the whole prompt's KV, ready for decoding."""

    logits: torch.Tensor
    kv: KV
    moved: int
    recomputed: int


def prefill(
    model: Any, token_ids: Sequence[int], past: KV | None = None
) -> tuple[KV, torch.Tensor]:
    """KV of `token_ids` after `past` (only the new tokens' part) and the last logits."""
    cache = as_cache(model, past)
    before = 0 if past is None else int(past[0][0].shape[-2])
    with torch.inference_mode():
        ids = torch.tensor([list(token_ids)], device=model.device)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    kv = tuple((k[..., before:, :], v[..., before:, :]) for k, v, *_ in cache)
    return kv, out.logits[0, -1]


def as_cache(model: Any, kv: KV | None) -> DynamicCache:
    """A transformers cache holding `kv` (empty when None), to decode after it."""
    if kv is None:
        return DynamicCache(config=model.config)
    return DynamicCache(ddp_cache_data=list(kv), config=model.config)


def blend(
    model: Any, token_ids: Sequence[int], exact: KV | None, pieces: Sequence[Piece],
    selection: Selection,
) -> BlendResult:
    """Prefill `token_ids` from the exact KV of its first tokens and pieces computed elsewhere.

    Tokens no piece covers (the question) are computed; pieces computed at their own
    positions right after the exact part extend it; the others are re-rotated to their
    positions and a share of their tokens is recomputed over the whole prompt.
    """
    require_llama_like(model)
    with torch.inference_mode():
        keys, values, n_exact = _assemble(model, len(token_ids), exact, pieces)
        moved = _moved_positions(pieces, n_exact)
        logits, recomputed = _selective_forward(
            model, token_ids, keys, values, n_exact, moved, pieces, selection
        )
    kv = tuple(zip(keys, values, strict=True))
    return BlendResult(logits=logits, kv=kv, moved=len(moved), recomputed=recomputed)


# -- assembly ------------------------------------------------------------------------------


def _assemble(
    model: Any, total: int, exact: KV | None, pieces: Sequence[Piece]
) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """One [1, kv_heads, total, head_dim] tensor per layer for keys and values, filled from
    the exact part and the (re-rotated) pieces; the rest is written by the recompute."""
    template = (exact or pieces[0].kv)[0][0] if (exact or pieces) else None
    if template is None:
        raise ValueError("nothing to reuse: no exact KV and no pieces")
    layers = model.config.num_hidden_layers
    shape = (1, template.shape[1], total, template.shape[-1])
    keys = [template.new_zeros(shape) for _ in range(layers)]
    values = [template.new_zeros(shape) for _ in range(layers)]
    n_exact = 0 if exact is None else int(exact[0][0].shape[-2])
    for i, (k, v) in enumerate(exact or ()):
        keys[i][..., :n_exact, :] = k
        values[i][..., :n_exact, :] = v
    if any(piece.start < n_exact for piece in pieces):
        raise ValueError("pieces must start after the exact KV (cut them first)")
    freqs = inv_freq(model)
    for piece in sorted(pieces, key=lambda p: p.start):
        _place(piece, keys, values, freqs)
        if piece.start == n_exact and piece.settled:
            n_exact = piece.end  # computed where it stands, after exactly this: exact
    return keys, values, n_exact


def _place(
    piece: Piece, keys: list[torch.Tensor], values: list[torch.Tensor], freqs: torch.Tensor
) -> None:
    delta = piece.start - piece.computed_at
    for i, (k, v) in enumerate(piece.kv):
        keys[i][..., piece.start : piece.end, :] = shift_keys(k, delta, freqs) if delta else k
        values[i][..., piece.start : piece.end, :] = v


def _moved_positions(pieces: Sequence[Piece], n_exact: int) -> list[int]:
    return [p for piece in pieces if not piece.settled
            for p in range(max(piece.start, n_exact), piece.end)]


# -- selection -----------------------------------------------------------------------------


def _sinks(pieces: Sequence[Piece], n_exact: int, per_piece: int) -> list[int]:
    """The first `per_piece` tokens of every moved piece."""
    moved = [p for p in pieces if p.end > n_exact]
    return [i for p in moved for i in range(max(p.start, n_exact), min(p.end, p.start + per_piece))]


def _tail(pieces: Sequence[Piece], n_exact: int, budget: int) -> list[int]:
    """The last moved piece from its start, then the other moved pieces' first tokens
    (an equal number each) with what the budget leaves."""
    moved = sorted((p for p in pieces if p.end > n_exact), key=lambda p: p.start)
    if not moved:
        return []
    last = moved[-1]
    chosen = list(range(max(last.start, n_exact), last.end))[:budget]
    left, others = budget - len(chosen), moved[:-1]
    if left > 0 and others:
        chosen += _sinks(others, n_exact, math.ceil(left / len(others)))[:left]
    return sorted(chosen)


def _budget(selection: Selection, moved: int) -> int:
    return min(moved, math.ceil(selection.share * moved))


def _plan(
    selection: Selection, moved: list[int], pieces: Sequence[Piece], n_exact: int
) -> tuple[list[int], int]:
    """(tokens chosen before any layer runs, how many more to choose by deviation)."""
    budget = _budget(selection, len(moved))
    if selection.method in SCORES or budget == 0:
        return [], budget
    if selection.method == "sink":
        n_moved = sum(1 for p in pieces if p.end > n_exact)
        return _sinks(pieces, n_exact, math.ceil(budget / max(1, n_moved)))[:budget], 0
    if selection.method == "tail":
        return _tail(pieces, n_exact, budget), 0
    sinks = _sinks(pieces, n_exact, selection.sink_tokens)[:budget]
    return sinks, budget - len(sinks)


def _scores(
    method: str, layer: Any, h: torch.Tensor, rows: torch.Tensor,
    cos_sin: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor, values: torch.Tensor,
    n_fresh: int,
) -> torch.Tensor:
    """Per row, how much recomputing it matters, by `hkvd` or `attn` (see SELECTORS)."""
    q, k, v = _qkv(layer.self_attn, layer.input_layernorm(h), cos_sin)
    if method.endswith("hkvd"):
        score = _relative_gap(k, keys[:, :, rows]) + _relative_gap(v, values[:, :, rows])
    # Computed anyway: every row keeps its better KV at this layer, chosen or not.
    keys[:, :, rows] = k
    values[:, :, rows] = v
    if method.endswith("attn"):
        score = _question_attention(layer.self_attn, q[:, :, -n_fresh:], rows, keys)
    return score


def _relative_gap(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    # Keys and values have different scales; each is weighed against its own size.
    gap = (new - old).pow(2).sum(dim=(1, 3))
    return (gap / new.pow(2).sum(dim=(1, 3)).clamp_min(1e-12))[0]


def _question_attention(
    attn: Any, q: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """Attention the last rows (the question) pay each row, summed over heads and queries."""
    last = int(rows[-1]) + 1
    n_q = q.shape[2]
    k = keys[:, :, :last].repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
    logits = (q @ k.transpose(-1, -2)) * attn.scaling
    visible = torch.arange(last, device=rows.device) <= rows[-n_q:].unsqueeze(1)
    probs = logits.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return probs.sum(dim=(0, 1, 2))[rows]


# -- the forward over the chosen rows ------------------------------------------------------


def _selective_forward(
    model: Any, token_ids: Sequence[int], keys: list[torch.Tensor], values: list[torch.Tensor],
    n_exact: int, moved: list[int], pieces: Sequence[Piece], selection: Selection,
) -> tuple[torch.Tensor, int]:
    covered = set(range(n_exact)) | {i for p in pieces for i in range(p.start, p.end)}
    fresh = [i for i in range(len(token_ids)) if i not in covered]
    if not fresh or fresh[-1] != len(token_ids) - 1:
        raise ValueError("the last prompt token must be computed (it gives the logits)")
    chosen, by_score = _plan(selection, moved, pieces, n_exact)
    # Scoring needs every candidate computed up to the check layer; the rest never runs.
    first = sorted(set(fresh) | set(chosen) | (set(moved) if by_score else set()))
    rows = torch.tensor(first, device=keys[0].device)
    inner = model.model
    h = inner.embed_tokens(torch.tensor([[token_ids[i] for i in first]], device=rows.device))
    forced = set(fresh) | set(chosen)
    keep_always = torch.tensor([i in forced for i in first])
    last_layer = len(inner.layers) - 1
    checks = {min(k, last_layer): n for k, n in selection.kept(len(moved)).items()}
    mask = _causal_mask(rows, h.dtype)
    for index, layer in enumerate(inner.layers):
        cos_sin = inner.rotary_emb(h, rows.unsqueeze(0))
        if by_score and index in checks:
            score = _scores(
                selection.method, layer, h, rows, cos_sin, keys[index], values[index], len(fresh)
            )
            keep = _top_rows(score, keep_always, max(0, checks[index] - len(chosen)))
            h, rows, keep_always = h[:, keep], rows[keep], keep_always[keep]
            cos_sin = (cos_sin[0][:, keep], cos_sin[1][:, keep])
            mask = _causal_mask(rows, h.dtype)
        h = _layer(layer, h, rows, cos_sin, keys[index], values[index], mask)
    logits = model.lm_head(inner.norm(h[:, -1:]))[0, -1]
    recomputed = len(set(rows.tolist()) & set(moved))
    return logits, recomputed


def _top_rows(score: torch.Tensor, keep_always: torch.Tensor, extra: int) -> torch.Tensor:
    """Indices (ascending) of the rows always kept plus the `extra` others scoring highest."""
    candidates = score.masked_fill(keep_always, float("-inf"))
    extra = min(extra, int((~keep_always).sum()))
    picked = torch.topk(candidates, extra).indices if extra else candidates.new_empty(0).long()
    mask = keep_always.clone()
    mask[picked] = True
    return mask.nonzero().flatten()


def _causal_mask(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [rows, last row + 1]: each row sees the prompt up to its own position.

    Additive rather than boolean: torch's CPU attention runs about twice as fast with it
    (22 vs 13 ms for 260 rows over 789 keys, one thread), and it is built once per row set,
    not once per layer.
    """
    last = int(rows[-1]) + 1
    visible = torch.arange(last, device=rows.device).unsqueeze(0) <= rows.unsqueeze(1)
    return torch.zeros(visible.shape, dtype=dtype, device=rows.device).masked_fill(
        ~visible, float("-inf"))


def _layer(
    layer: Any, h: torch.Tensor, rows: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
    keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
) -> torch.Tensor:
    """One decoder layer over the chosen rows; their new KV is written into the prompt's."""
    attn = layer.self_attn
    q, k, v = _qkv(attn, layer.input_layernorm(h), cos_sin)
    keys[:, :, rows] = k
    values[:, :, rows] = v
    last = mask.shape[-1]
    out = F.scaled_dot_product_attention(
        q, keys[:, :, :last], values[:, :, :last], attn_mask=mask, scale=attn.scaling,
        enable_gqa=True,
    )
    h = h + attn.o_proj(out.transpose(1, 2).reshape(1, rows.numel(), -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def _qkv(
    attn: Any, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys (rotated to their positions) and values, each [1, heads, rows, head_dim]."""
    shape = (1, x.shape[1], -1, attn.head_dim)
    q = attn.q_proj(x).view(shape).transpose(1, 2)
    k = attn.k_proj(x).view(shape).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = (t.unsqueeze(1) for t in cos_sin)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def require_llama_like(model: Any) -> None:
    """The selective forward re-implements a Llama decoder layer; other layouts are refused."""
    inner = getattr(model, "model", None)
    layer = getattr(inner, "layers", [None])[0]
    attn = getattr(layer, "self_attn", None)
    parts = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
    llama = attn is not None and all(hasattr(attn, p) for p in parts)
    if not llama or hasattr(attn, "q_norm") or not hasattr(inner, "rotary_emb"):
        name = type(model).__name__
        raise ValueError(f"chunk blending supports Llama-style decoders, not {name}")
