"""What an edit re-warms: its dependents' ranking, and the other questions it reaches.

`apply_indexed` ranks an edit's re-warms here (`candidates`), then re-checks the other
recently asked prefixes (`recheck_others`, with `edit_watch`): a question's top-3 can
change through a document its prefix never used (an edit that makes one of its chunks rank
higher than one it used), and no dependent link leads there. Without `edit_watch` an edit
re-checks its own dependents only (event-rag).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from schemas import KbChange
from streams.decide import asks, logic, priority
from streams.decide.records import PrefixOp
from streams.handle import retrieval
from streams.handle.deps import HandlerDeps
from streams.handle.ports import WarmPrefix


@dataclass(frozen=True)
class EditBudget:
    """What one KB change may re-warm, read once from the fleet's last reports.

    `tokens`: KV tokens it may re-warm into prefixes no worker holds any more (the edit share
    of the ready workers' memory). `older_tokens`: what of it the dependents asked before
    the hot window may take (what no pin holds yet: the hot set's, earlier holds). `rest`:
    how many dependents it may re-warm beyond those (`edit_rewarm_rest`) where every ready
    worker keeps a KV tier, so holds spill there rather than pin device memory; else none.
    A worker's heartbeats report its tier's spilled bytes: one that has spilled nothing yet
    counts as without (its device still has room)."""

    tokens: int
    older_tokens: int
    rest: int


def edit_budget(p: HandlerDeps) -> EditBudget:
    ready = [w for w in p.live_workers() if w.ready]
    per_token = max(1, p.kv_bytes_per_token())
    tokens = int(p.settings.edit_rewarm_share * sum(w.mem_total for w in ready)) // per_token
    pinned = sum(w.pinned for w in ready) // per_token
    spills = bool(ready) and all(w.tier_bytes > 0 for w in ready)
    return EditBudget(tokens, max(0, tokens - pinned),
                      p.settings.edit_rewarm_rest if spills else 0)


def older(p: HandlerDeps, dependents: Collection[str], recent: Sequence[logic.HotCandidate]
          ) -> list[logic.HotCandidate]:
    """The dependents asked more than once before the hot window (`recent`), most asked
    first, not the hot set's (pinned already)."""
    skip = {c.prefix_hash for c in recent} | {op.prefix_hash for op in p.tracker.hot.values()}
    return [logic.HotCandidate(h, s.count, s.tokens)
            for h, s in asks.often_asked(p.asks.seen, dependents, skip)]


def candidates(p: HandlerDeps, dependents: Collection[str],
               now: float) -> list[logic.HotCandidate]:
    """The dependents an edit may re-warm, with their asks in the hot window; the hot
    set's are pinned already and re-warmed pinned, so they take no edit budget.

    Not the asks of the longer hold window: ranked by those (model-free replays of the
    strategies workload, docs/lab/benchmarks-notebook.md) an edit holds many prefixes asked
    once long ago, the holds of successive edits fill the pinned share and the LRU loses the room
    request caching needs (hit rate 81% -> 61%). Nor the latest ask as a tie-break among
    equally asked ones: it held the less useful ones there too (81% -> 75%)."""
    pinned = {op.prefix_hash for op in p.tracker.hot.values()}
    return [
        logic.HotCandidate(h, c, pl.prefix_tokens)
        for h, c, pl in p.tracker.ranked(now) if h in dependents and h not in pinned
    ]


async def recheck_others(
    p: HandlerDeps, change: KbChange, new_chunks: Mapping[str, str],
    dependents: Collection[str], ops: Sequence[PrefixOp],
    recent: Sequence[logic.HotCandidate], budget: int,
) -> None:
    """Retrieve again the questions of prefixes asked lately that use none of the edited
    document's chunks; where its new chunks now enter the top-3, warm that prefix held,
    within what the dependents' re-warms left of the edit's budget."""
    if not (p.settings.edit_watch and new_chunks and p.settings.edit_recheck_questions):
        return
    rewarmed = {op.prefix_hash for op in ops if op.rewarm}
    left = budget - sum(c.tokens for c in recent if c.prefix_hash in rewarmed)
    pinned = {op.prefix_hash for op in p.tracker.hot.values()}
    recent_asks = p.asks.recent(p.clock())
    order = [(h, a) for h, a in asks.recheck_order(recent_asks, {*dependents, *pinned},
                                                   p.settings.edit_recheck_questions)
             if a.tenant == change.tenant]
    if order and p.replica is not None:
        await p.replica.caught_up()  # retrieve over this edit, wherever it was indexed
    # Its retrievals (up to edit_recheck_questions) yield to the edit's own re-warms, which
    # the ops just sent lead to (`streams.decide.priority`).
    with priority.background():
        await _recheck(p, change, new_chunks, order, left)


async def _recheck(p: HandlerDeps, change: KbChange, new_chunks: Mapping[str, str],
                   order: Sequence[tuple[str, asks.Asked]], left: int) -> None:
    # Only those that fit the budget left before any is warmed are retrieved (it shrinks).
    wanted = [(h, a) for h, a in order if a.tokens <= left]
    for batch in retrieval.batches(wanted):
        questions = [a.question for _, a in batch]
        found = await p.blocking(retrieval.prefixes_for_questions, p.rag, questions,
                                 change.tenant)
        p.stats["edit_rechecks"] += len(batch)
        for (prefix_hash, asked), prefix in zip(batch, found, strict=True):
            if asked.tokens > left or prefix is None or prefix.prefix_hash == prefix_hash:
                continue
            if len(prefix.token_ids) <= left and asks.entered(prefix.chunk_refs, new_chunks):
                left -= len(prefix.token_ids)
                p.stats["edit_recheck_warms"] += 1
                await p.out.op(_held_warm(prefix, change, asked.question, p.clock()))


def _held_warm(prefix: WarmPrefix, change: KbChange, question: str, now: float) -> PrefixOp:
    """Warm and hold (pinned until its next ask) a prefix an edit's chunks entered."""
    return PrefixOp(
        op="warm", prefix_hash=prefix.prefix_hash, tenant=change.tenant,
        chunk_refs=list(prefix.chunk_refs), token_ids=prefix.token_ids, question=question,
        chunk_spans=prefix.chunk_spans,
        hold=True, reason=f"{change.doc_id} v{change.version}: entered the top-3",
        origin_ts=now,
    )
