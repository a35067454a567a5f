"""Whether blending a prompt beats computing it (pure): a cost estimate learned from timings.

A plain prefill costs about `per_token` × the tokens after the exact prefix. A blend computes
fewer tokens (those no held chunk covers, plus the recomputed share of the moved ones) but
pays per moved token too: its KV is read out of the donor's blocks, re-rotated, and (with a
scored selection) run through the first layers to be ranked, and the blend has a fixed cost
of its own (assembling the prompt's KV, a second pass for an opening the exact prefix left
out). So a blend that moves many tokens to save a few is slower than the cold prefill it
replaces: that is what made blended rows the slowest on 595a69d.

`per_token` is a moving average of the engine's own plain forwards; the blend's own cost
(`seconds - per_token × computed`) is fitted against the moved tokens by least squares over
the blends seen, newest weighted most. Until two blends of different sizes were timed, a
blend is tried only where it computes at most `explore_ratio` of the cold tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Line:
    """y ≈ a + b·x by least squares, each sample's weight decaying by `decay` per new one."""

    decay: float
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    xs: set[int] = field(default_factory=set)

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.n, self.sx, self.sy = d * self.n + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y
        if len(self.xs) < 2:
            self.xs.add(int(x))

    @property
    def fitted(self) -> bool:
        return len(self.xs) >= 2

    def at(self, x: float) -> float:
        var = self.n * self.sxx - self.sx * self.sx
        slope = (self.n * self.sxy - self.sx * self.sy) / var if var > 0 else 0.0
        slope = max(slope, 0.0)  # a moved token never makes a blend cheaper by itself
        return max(0.0, (self.sy - slope * self.sx) / self.n) + slope * x


@dataclass
class BlendCosts:
    """Running estimates of a plain prefill's and a blend's cost (see the module doc)."""

    explore_ratio: float = 0.5
    weight: float = 0.3  # of the newest plain-forward sample in the per-token average
    decay: float = 0.9  # of older blend samples in the fit
    per_token: float | None = None
    _extra: _Line = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.explore_ratio <= 1 or not 0 < self.weight <= 1 or not 0 < self.decay <= 1:
            raise ValueError("explore_ratio, weight and decay must be within (0, 1]")
        self._extra = _Line(self.decay)

    @property
    def learned(self) -> bool:
        return self.per_token is not None and self._extra.fitted

    def saw_prefill(self, n_tokens: int, seconds: float) -> None:
        """A plain forward computed `n_tokens` in `seconds`."""
        if n_tokens > 0:
            sample, old, w = seconds / n_tokens, self.per_token, self.weight
            self.per_token = sample if old is None else (1 - w) * old + w * sample

    def saw_blend(self, computed: int, moved: int, seconds: float) -> None:
        """A blend computed `computed` tokens and placed `moved` from chunk KV in `seconds`."""
        if self.per_token is not None:
            self._extra.add(moved, seconds - self.per_token * computed)

    def cold_s(self, cold_tokens: int) -> float | None:
        """Estimated seconds of the plain prefill of `cold_tokens` (None: never timed)."""
        return None if self.per_token is None else self.per_token * cold_tokens

    def blend_s(self, computed: int, moved: int) -> float | None:
        """Estimated seconds of a blend (None until learned)."""
        if not self.learned or self.per_token is None:
            return None
        return self.per_token * computed + self._extra.at(moved)

    def worth(self, cold_tokens: int, computed: int, moved: int) -> bool:
        """Whether a blend computing `computed` tokens and moving `moved` is estimated to be
        faster than the plain prefill of the `cold_tokens` after the exact prefix."""
        if moved < 1 or computed >= cold_tokens:
            return False
        blend, cold = self.blend_s(computed, moved), self.cold_s(cold_tokens)
        if blend is None or cold is None:
            return computed <= self.explore_ratio * cold_tokens
        return blend < cold


def blend_computed(uncovered: int, moved: int, share: float) -> int:
    """Tokens a blend runs through every layer: those no chunk KV covers and the recomputed
    share of the moved ones (rounded up, as the selection does)."""
    return uncovered + min(moved, math.ceil(share * moved))  # as `blend._budget` counts


def check_shares(share: float, n_checks: int, widen: float) -> list[float]:
    """Share of the moved tokens kept after each of `n_checks` check layers of a scored
    selection: `widen` × share at the first narrowing down to share at the last."""
    return [min(1.0, share * widen ** ((n_checks - 1 - i) / max(1, n_checks - 1)))
            for i in range(n_checks)]


def moved_layer_share(share: float, checks: tuple[int, ...], widen: float, layers: int,
                      *, scored: bool = True) -> float:
    """Layers a moved token runs through on average, as a share of all `layers`: every one
    runs up to the first check, then the kept shares (`check_shares`) run on to the next
    (a scored selection); an unscored one runs the recomputed share only."""
    if not scored or share == 0:
        return share
    kept = check_shares(share, len(checks), widen)
    bounds = [*(min(c, layers) for c in checks), layers]
    token_layers = bounds[0] + sum(k * (b - a) for k, a, b in zip(kept, bounds, bounds[1:],
                                                                  strict=False))
    return token_layers / layers
