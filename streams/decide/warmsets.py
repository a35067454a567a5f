"""Which prefixes the app keeps warm as a set: the hot set of the query stream, and what
a worker that (re)started empty gets. Pure functions, re-exported by `streams.decide.logic`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from schemas.prefix import prefix_kv_bytes
from streams.decide.records import PrefixState

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
        need = prefix_kv_bytes(cand.tokens, bytes_per_token)  # whole blocks, as stored
        if cand.count < min_count or not 0 < need <= budget_bytes - used:  # 0: under a block
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
    history prefill warms). Most used first: reported uses plus the count in the hot-token
    window, then last use, while they fit `budget_bytes`; a prefix too large for what is left
    is skipped, smaller ones after it may still fit. The window's count is added, not ranked
    first: a prefix asked once in the last minutes outranked one asked all day, and a ready
    worker's first asks missed the steady favourites that history warms (issue 17's replays:
    hybrid's hits up on two of five workloads, none down). Ranked by uses alone, the
    prefixes asked now fell out of the plan.
    """
    counts = counts or {}
    skipped = set(skip)
    live = [(h, s) for h, s in tracked if h not in skipped]
    live.sort(key=lambda hs: (-(counts.get(hs[0], 0.0) + hs[1].uses), -hs[1].updated_at, hs[0]))
    chosen, used = [], 0
    for prefix_hash, state in live:
        need = prefix_kv_bytes(len(state.token_ids), bytes_per_token)
        if not 0 < need <= budget_bytes - used:  # 0: under one block, nothing to warm
            continue
        chosen.append(prefix_hash)
        used += need
    return chosen


# --- A KB change (keyed by tenant + doc_id) --------------------------------------------------


def edit_rewarm(
    dependents: Iterable[str], recent: Sequence[HotCandidate], budget_tokens: int,
    older: Sequence[HotCandidate] = (), older_tokens: int = 0, *, rest: int = 0,
) -> set[str]:
    """The dependents an edit re-warms wherever they are (held or evicted) and holds.

    Their questions come back after an edit to their documents (to see what changed), and
    by then the worker's LRU has often evicted them: an invalidated prefix's KV is wrong
    everywhere and request caching cannot rebuild it before that ask, and an unchanged one
    (or its re-retrieval's new top-3) is an unpinned entry among many. Those asked in the
    hot window qualify, most asked first, while their tokens fit `budget_tokens`:
    unbounded, an edit to a hub document re-prefilled a dozen rarely asked prefixes into a
    budget of about as many and pushed out the KV in use. A prefix too large for what is
    left is skipped, smaller ones after it may still fit.

    Then `older` (in their order): dependents asked more than once, last before the hot
    window. With the hot window alone, a `--standard` replay lost most post-edit asks to
    prefixes asked 670-2,840 s before the edit (docs/lab/benchmarks-notebook.md, issue 17).
    They take
    what is left of `budget_tokens` and at most `older_tokens` (the caller's room no pin
    holds yet): without that bound their holds piled up, filled the pinned share and the
    LRU evicted the questions being asked now (quick-mode replays, post-edit 94% -> 78%).
    """
    wanted = set(dependents)
    chosen, used = set(), 0
    by_asks = sorted(recent, key=lambda c: (-c.count, c.prefix_hash))
    for cand in by_asks:
        if cand.prefix_hash in wanted and used + cand.tokens <= budget_tokens:
            chosen.add(cand.prefix_hash)
            used += cand.tokens
    for cand in older:
        fits = used + cand.tokens <= budget_tokens and cand.tokens <= older_tokens
        if cand.prefix_hash in wanted and cand.prefix_hash not in chosen and fits:
            chosen.add(cand.prefix_hash)
            used += cand.tokens
            older_tokens -= cand.tokens
    # Then up to `rest` of the others (the workers keep a KV tier): asked in the window
    # first, then before it, then the rest in hash order. Their holds do not pin there
    # (`logic.hold_pins`), so what the device cannot keep spills to the tier and the ask
    # reads it back: the full workload's post-edit hits 62% -> 92% with a 4x tier
    # (docs/lab/2026-12-06-rewarm-rest.md). The count bounds an edit to a hub document.
    ranked = dict.fromkeys([*(c.prefix_hash for c in [*by_asks, *older]), *sorted(wanted)])
    others = [h for h in ranked if h in wanted and h not in chosen]
    return chosen | set(others[:rest])
