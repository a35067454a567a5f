"""Moving cached keys to other positions under rotary position encoding (RoPE)."""

from __future__ import annotations

from typing import Any

import torch


def inv_freq(model: Any) -> torch.Tensor:
    """The model's rotary frequencies θ_i, one per pair of head dimensions.

    Read from the rotary module itself, so scaled variants (llama3, linear, dynamic) give the
    frequencies the model really uses; their cos/sin scaling factor is left out on purpose:
    a re-rotation composes two rotations and must not scale the keys a second time.
    """
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    freqs = getattr(rotary, "inv_freq", None)
    if not isinstance(freqs, torch.Tensor):
        raise ValueError(f"{type(model).__name__} has no rotary embedding with inv_freq")
    return freqs


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the halves of the last dimension (transformers' Llama layout)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def shift_keys(keys: torch.Tensor, delta: int | torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Keys [..., tokens, head_dim] computed at positions p, as if computed at p + delta.

    RoPE rotates each pair of dimensions by p·θ_i; rotations compose, so moving by delta is
    one more rotation by delta·θ_i. `delta` is an int or a tensor of one delta per token.
    The angles are formed in float64: at positions of thousands, float32 angles alone
    would cost more precision than the model's own rotation has.
    """
    steps = torch.as_tensor(delta, dtype=torch.float64, device=keys.device).reshape(-1, 1)
    angles = steps * freqs.to(device=keys.device, dtype=torch.float64)
    angles = torch.cat((angles, angles), dim=-1)  # [tokens or 1, head_dim]
    cos = angles.cos().to(keys.dtype)
    sin = angles.sin().to(keys.dtype)
    return keys * cos + rotate_half(keys) * sin
