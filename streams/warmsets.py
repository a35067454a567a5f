"""Which prefixes the app keeps warm as a set: the hot set of the query stream, and what
a worker that (re)started empty gets. Pure functions, re-exported by `streams.logic`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from streams.records import PrefixState

# --- Hot set (keyed by tenant) ---------------------------------------------------------------


@dataclass(frozen=True)
class HotCandidate:
    prefix_hash: str
    count: float
    tokens: int


def plan_hot_set(
    ranked: Sequence[HotCandidate],
    budget_bytes: int,
    bytes_per_token: int,
    previously_hot: Iterable[str],
    min_count: float = 2.0,
) -> tuple[list[str], list[str]]:
    """The hottest prefixes that fit the hot-token budget, and those that cooled down.

    Greedy by count: a prefix too large for what is left is skipped, smaller ones after
    it may still fit. Returns (hot now, to release).
    """
    hot, used = [], 0
    for cand in ranked:
        need = cand.tokens * bytes_per_token
        if cand.count < min_count or used + need > budget_bytes:
            continue
        hot.append(cand.prefix_hash)
        used += need
    cooled = sorted(set(previously_hot) - set(hot))
    return hot, cooled


# --- A worker that became ready (keyed by worker id) ------------------------------------------


def plan_rewarm(
    tracked: Iterable[tuple[str, PrefixState]],
    now: float,
    budget_bytes: int,
    bytes_per_token: int,
    skip: Iterable[str] = (),
    counts: Mapping[str, float] | None = None,
) -> list[str]:
    """The tracked prefixes to prefill on a worker that (re)started empty.

    Every tracked prefix not in `skip` (already sent: the hot set), expired or not: an empty
    worker has room, and a prefix asked often yesterday is worth more than none (what a
    history prefill warms). Most used first (count in the hot-token window, then reported
    uses, then last use), while they fit `budget_bytes`; a prefix too large for what is left
    is skipped, smaller ones after it may still fit.
    """
    counts = counts or {}
    skipped = set(skip)
    live = [(h, s) for h, s in tracked if h not in skipped]
    live.sort(key=lambda hs: (-counts.get(hs[0], 0.0), -hs[1].uses, -hs[1].updated_at, hs[0]))
    chosen, used = [], 0
    for prefix_hash, state in live:
        need = len(state.token_ids) * bytes_per_token
        if used + need > budget_bytes:
            continue
        chosen.append(prefix_hash)
        used += need
    return chosen
