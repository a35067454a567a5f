"""The streams app's decisions as pure functions: event + current state in, actions out.

Agents in `streams/shell/agents.py` only decode, look state up, call these, and send what they
return. Nothing here does I/O, so every rule is tested by calling it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from schemas import ChunkRef, KbChange, WarmupCommand
from streams.decide.fleet import (  # noqa: F401 - re-exported: the app's decisions in one place
    MEMORY_THRESHOLD,
    EpochCheck,
    apply_worker_event,
    choose_worker,
    cold_weight,
    epoch_order,
    holders_of,
    hot_targets,
)
from streams.decide.records import DocLink, DocState, PrefixOp, PrefixState, WorkerState
from streams.decide.warmsets import (  # noqa: F401 - re-exported: the app's decisions in one place
    HotCandidate,
    edit_rewarm,
    plan_hot_set,
    plan_rewarm,
)

MAX_QUESTIONS_PER_PREFIX = 8
# How long a sent prefill is awaited before another is sent (a refused or lost command).
PREFILL_WAIT_S = 30.0


def command_id() -> str:
    return uuid.uuid4().hex


# --- KB changes (keyed by tenant + doc_id) -------------------------------------------------


@dataclass
class KbPlan:
    """What a KB change does: the document's new state and one op per dependent prefix."""

    stale: bool
    state: DocState | None = None
    ops: list[PrefixOp] = field(default_factory=list)


def plan_kb_change(
    change: KbChange,
    prior: DocState | None,
    new_chunks: Mapping[str, str],
    dependents: Mapping[str, Sequence[ChunkRef]],
    now: float,
    recent: Sequence[HotCandidate] = (),
    rewarm_tokens: int = 0,
    older: Sequence[HotCandidate] = (), older_tokens: int = 0, *, rewarm_rest: int = 0,
) -> KbPlan:
    """Compare the document's new chunk hashes with what each dependent prefix was built from.

    `new_chunks` is chunk_id -> content hash after indexing (empty on delete);
    `dependents` is prefix hash -> the refs of this document's chunks it depends on.
    A prefix with any ref no longer current is invalidated; the others get a longer TTL.
    `recent` are the prefixes asked in the hot window (count, size): the dependents among
    them, most asked first, within `rewarm_tokens` (`edit_rewarm`), are re-warmed and held
    (pinned until their next ask) whether a worker still holds them or not; then `older`,
    dependents asked more than once before that window, within `older_tokens` too; with
    `rewarm_rest` (workers spill to a KV tier) that many others. Ops go least asked first: each
    may re-warm its questions, and the LRU then keeps the most asked of them longest.
    """
    if change.is_stale(prior.version if prior else None):
        return KbPlan(stale=True)
    state = DocState(
        version=change.version,
        tenant=change.tenant,
        chunks=dict(new_chunks),
        deleted=change.op == "delete",
    )
    doc_changed = prior is None or dict(new_chunks) != prior.chunks
    ops = []
    stale = {
        h for h, refs in dependents.items()
        if any(new_chunks.get(r.chunk_id) != r.content_hash for r in refs)
    }
    rewarm = edit_rewarm(dependents if doc_changed else stale, recent, rewarm_tokens,
                         older, older_tokens, rest=rewarm_rest)
    rank = {c.prefix_hash: c.count for c in recent}
    order = sorted(dependents, key=lambda h: (rank.get(h, 0.0), h))
    for prefix_hash, refs in ((h, dependents[h]) for h in order):
        changed = [r for r in refs if new_chunks.get(r.chunk_id) != r.content_hash]
        ops.append(
            PrefixOp(
                op="invalidate" if changed else "extend_ttl",
                prefix_hash=prefix_hash,
                tenant=change.tenant,
                # An invalidation names only the stale refs: a worker drops every entry
                # built from them, so an unchanged chunk would take valid prefixes along.
                chunk_refs=list(changed or refs),
                reason=_reason(change, changed),
                origin_ts=now,
                # Still valid, but new or edited chunks of the document may now rank in
                # its questions' top-3: retrieve again and warm what they would use.
                recheck=not changed and doc_changed,
                rewarm=prefix_hash in rewarm,
                hold=prefix_hash in rewarm,
            )
        )
    return KbPlan(stale=False, state=state, ops=ops)


def _reason(change: KbChange, changed: Sequence[ChunkRef]) -> str:
    if not changed:
        return f"{change.doc_id} v{change.version}: dependent chunks unchanged"
    ids = ", ".join(r.chunk_id for r in changed[:3])
    return f"{change.doc_id} v{change.version} {change.op}: changed {ids}"


def apply_doc_link(links: Mapping[str, list], link: DocLink) -> dict[str, list]:
    """The doc_prefixes entry after adding or removing one dependent prefix."""
    updated = dict(links)
    if link.link:
        updated[link.prefix_hash] = [r.model_dump(mode="json") for r in link.chunk_refs]
    else:
        updated.pop(link.prefix_hash, None)
    return updated


def plan_doc_link(
    links: Mapping[str, list], link: DocLink, doc: DocState | None
) -> tuple[dict[str, list], PrefixOp | None]:
    """Record a link; a prefix linked after its document changed is invalidated at once.

    A prefill decided from an older chunk can reach this partition after the change that
    replaced the chunk; the docs table here is current, so the race is caught here.
    """
    updated = apply_doc_link(links, link)
    if not link.link or doc is None:
        return updated, None
    stale = [r for r in link.chunk_refs if doc.chunks.get(r.chunk_id) != r.content_hash]
    if not stale:
        return updated, None
    op = PrefixOp(
        op="invalidate",
        prefix_hash=link.prefix_hash,
        tenant=link.tenant,
        chunk_refs=stale,
        reason=f"{link.doc_id} changed before the prefix was linked",
    )
    return updated, op


# --- Prefix ops (keyed by prefix hash) -----------------------------------------------------


@dataclass
class PrefixPlan:
    """Commands for workers, the prefix's new state (None: drop it), links, re-retrievals."""

    commands: list[WarmupCommand] = field(default_factory=list)
    state: PrefixState | None = None
    links: list[DocLink] = field(default_factory=list)
    rewarm_questions: list[str] = field(default_factory=list)
    rewarm_pin: bool = False
    rewarm_hold: bool = False
    counters: dict[str, int] = field(default_factory=dict)


def plan_prefix_op(
    op: PrefixOp,
    state: PrefixState | None,
    workers: Sequence[WorkerState],
    now: float,
    ttl_s: float,
) -> PrefixPlan:
    """Decide what one op does to one prefix, given the workers' reported state."""
    handler = {
        "invalidate": _invalidate,
        "extend_ttl": _extend_ttl,
        "warm": _warm,
        "warm_on": _warm,
        "cool": _cool,
        "forget": _forget,
        "resend": _resend,
        "stored": _stored,
    }[op.op]
    return handler(op, state, workers, now, ttl_s)


def _invalidate(op, state, workers, now, ttl_s) -> PrefixPlan:
    # The stale refs only: every entry built from one is stale (whatever its prefix), but
    # another prefix that shares one of this prefix's unchanged chunks is still valid.
    # Broadcast: any worker may hold it (a reactive cache or a previous placement).
    cmd = WarmupCommand(
        command_id=command_id(),
        op="invalidate",
        prefix_hash=op.prefix_hash,
        tenant=op.tenant,
        chunk_refs=op.chunk_refs,
        reason=op.reason,
    )
    plan = PrefixPlan(commands=[cmd], counters={"invalidations": 1})
    if state is not None:
        plan.links = _links(op.prefix_hash, state.chunk_refs, state.tenant, link=False)
        if op.rewarm or _warm_now(op.prefix_hash, state, workers):
            plan.rewarm_questions = list(state.questions)
            plan.rewarm_pin = state.hot
            # A hold waits for its question's next ask: when an edit replaces the held
            # prefix before that ask, the question's new prefix is held in its place.
            plan.rewarm_hold = op.hold or state.held_at is not None
    return plan


def stale_prefix_invalidation(op: PrefixOp, state: PrefixState | None) -> PrefixOp | None:
    """The invalidate op for a tracked prefix whose own refs a warm op found stale (None:
    the op names other refs, or nothing is tracked; only that op is skipped). A prefix built
    from stale text is stale for good; its state left in the table (its invalidation missed
    it) made every query of it send the same stale op again (`query_warm_op`), each skipped
    while the ops behind it waited. By hash only: its other chunks may still be current."""
    if state is None or set(state.chunk_refs) != set(op.chunk_refs):
        return None
    return PrefixOp(op="invalidate", prefix_hash=op.prefix_hash, tenant=state.tenant,
                    reason=f"its chunk refs went stale (found by a {op.reason or op.op} op)")


def _warm_now(prefix_hash: str, state: PrefixState, workers: Sequence[WorkerState]) -> bool:
    """Whether an edit re-warms this prefix's questions without the KB plan's say: it is
    hot, or some worker holds it (its re-warm replaces KV the edit frees). An evicted one
    re-warms only when the plan chose it (`PrefixOp.rewarm`, within the edit's budget)."""
    return state.hot or bool(holders_of(prefix_hash, workers))


def _extend_command(op: PrefixOp, tenant: str, ttl_s: float) -> WarmupCommand:
    return WarmupCommand(
        command_id=command_id(),
        op="extend_ttl",
        prefix_hash=op.prefix_hash,
        tenant=tenant,
        ttl_s=ttl_s,
        reason=op.reason,
    )


def _extend_ttl(op, state, workers, now, ttl_s) -> PrefixPlan:
    if state is None:
        return PrefixPlan()
    cmd = _extend_command(op, state.tenant, ttl_s)
    new_state = state.model_copy(update={"expires_at": now + ttl_s, "updated_at": now})
    return PrefixPlan(
        commands=[cmd],
        state=new_state,
        counters={"ttl_extensions": 1},
        # Re-retrieved: what they retrieve now may differ; the same prefix is held in place.
        rewarm_questions=(
            list(state.questions)
            if op.recheck and (op.rewarm or _warm_now(op.prefix_hash, state, workers))
            else []
        ),
        rewarm_pin=state.hot,
        rewarm_hold=op.hold and op.recheck,
    )


def _warm(op, state, workers, now, ttl_s) -> PrefixPlan:
    questions = _merge_questions(state.questions if state else [], op.question)
    holders = holders_of(op.prefix_hash, workers)
    target = op.target_worker if op.op == "warm_on" else None
    pin = op.pin or bool(state and state.hot)
    base = state or PrefixState(
        tenant=op.tenant,
        chunk_refs=op.chunk_refs,
        token_ids=op.token_ids,
        chunk_spans=op.chunk_spans,
        expires_at=0.0,
        synthetic=op.synthetic,
    )
    asked = op.reason == "query"
    new_state = base.model_copy(
        update={
            "questions": questions,
            "expires_at": now + ttl_s,
            "updated_at": now,
            "hot": pin,
            "uses": base.uses + asked,
            "held_at": now if op.hold else None if asked else base.held_at,
            # A state recorded before prefixes knew their chunks' places learns them here.
            "chunk_spans": base.chunk_spans or op.chunk_spans,
        }
    )
    plan = PrefixPlan(state=new_state)
    if state is None:
        plan.links = _links(op.prefix_hash, op.chunk_refs, op.tenant, link=True)
    if asked and state is not None and state.held_at is not None:
        plan.commands, plan.counters = _end_hold(op, state)  # the ask it was held for came
    if target is not None and target in holders or target is None and holders:
        if op.hold and (state is None or state.held_at is None) and not pin:
            # Held in place: the same KV, pinned until its next ask.
            plan.commands = [_prefill(op, new_state, holders[0], ttl_s,
                                      hold_pins(holders[0], workers), op.tier)]
            plan.counters = {"holds": 1}
        # Already warm where it is wanted. A prefix still in use must not expire under its
        # users: past half its TTL, the holders' copies get the new expiry too.
        elif state is not None and state.expires_at - now < ttl_s / 2:
            plan.commands.append(_extend_command(op, state.tenant, ttl_s))
            plan.counters["ttl_extensions"] = 1
        return plan
    if target is None and prefill_pending(state, now):
        return plan  # a prefill is already on its way; wait for the worker's report
    worker = target or choose_worker(workers, [op.prefix_hash])
    if worker is None:
        plan.counters = {"no_worker": 1}
        return plan
    pin = pin or op.hold and hold_pins(worker, workers)
    plan.state = new_state.model_copy(update={"worker_id": worker, "prefill_at": now,
                                              "resends": 0, "tier": op.tier and not pin})
    # An ask always finds it held (the op that brought it here), so a release never
    # precedes this prefill; `_end_hold`'s command is dropped with the stale KV.
    plan.commands = [_prefill(op, plan.state, worker, ttl_s, pin, op.tier)]
    plan.counters = {"prefills": 1, "holds": int(op.hold)}
    return plan


def hold_pins(worker: str, workers: Sequence[WorkerState]) -> bool:
    """Whether an edit's hold pins its prefix on `worker`: only where it keeps no KV tier
    below device memory. A worker with one (its spilled bytes reported) spills an unpinned
    hold that eviction takes, and the ask reads it back; a pin would keep the prefix on the
    device, from request caching's bytes, until that ask (model-free sweeps of 2026-12-06:
    Prometheus post-edit hits 85% -> 95%; docs/lab/2026-12-06-host-tier.md)."""
    state = next((w for w in workers if w.worker_id == worker), None)
    return state is None or state.tier_bytes == 0


def prefill_pending(state: PrefixState | None, now: float) -> bool:
    """Whether a prefill of the prefix was sent less than `PREFILL_WAIT_S` ago and no worker
    reported it stored since (`_stored` clears `prefill_at`)."""
    return state is not None and state.prefill_at is not None and (
        state.prefill_at > now - PREFILL_WAIT_S
    )


def _stored(op, state, workers, now, ttl_s) -> PrefixPlan:
    """A worker stored the prefill: nothing is on its way any more, so an eviction after
    this is warmed again at once (and never taken for a lost prefill by the resend timer)."""
    if state is None or state.prefill_at is None:
        return PrefixPlan(state=state)
    return PrefixPlan(state=state.model_copy(update={"prefill_at": None, "resends": 0}))


def _end_hold(op: PrefixOp, state: PrefixState) -> tuple[list[WarmupCommand], dict[str, int]]:
    """Unpin a prefix an edit held (it goes back to the LRU), unless the hot set pins it."""
    if state.hot:
        return [], {}
    cmd = WarmupCommand(
        command_id=command_id(),
        op="release",
        prefix_hash=op.prefix_hash,
        tenant=state.tenant,
        reason="asked after the edit that held it" if op.reason == "query" else op.reason,
    )
    return [cmd], {"releases": 1}


def _prefill(op: PrefixOp, state: PrefixState, worker: str, ttl_s: float, pin: bool,
             tier: bool):  # tier: into the worker's KV tier only (never a pinned prefix)
    return WarmupCommand(
        command_id=command_id(),
        op="prefill",
        worker_id=worker,
        prefix_hash=op.prefix_hash,
        tenant=state.tenant,
        token_ids=state.token_ids,
        chunk_refs=state.chunk_refs,
        chunk_spans=state.chunk_spans,
        ttl_s=ttl_s,
        pin=pin,
        reason=op.reason,
        placement="tier" if tier and not pin else "device",
    )


def with_expiry(cmd: WarmupCommand, now: float, expiry_s: float) -> WarmupCommand:
    """A prefill (of a prefix or a chunk) or a synthesize, stamped with when it stops being
    worth carrying out; other ops unchanged (an invalidation must never be skipped, however
    late it is read)."""
    if cmd.op not in ("prefill", "prefill_chunk", "synthesize"):
        return cmd
    expires = datetime.fromtimestamp(now + expiry_s, UTC)
    return cmd.model_copy(update={"expires_at": expires})


# --- Prefills nobody confirmed (the resend timer) ---------------------------------------


def needs_resend(
    prefix_hash: str, state: PrefixState, workers: Sequence[WorkerState], now: float,
    window_s: float,
) -> bool:
    """A prefill sent more than `PREFILL_WAIT_S` and less than `window_s` ago that no ready
    worker reports holding, for a prefix still wanted (unexpired). Older prefills are left
    alone: a prefix stored then evicted long ago was the cache's choice, not a loss."""
    if state.prefill_at is None or state.expires_at <= now:
        return False
    age = now - state.prefill_at
    if not PREFILL_WAIT_S <= age < window_s:
        return False
    return not holders_of(prefix_hash, [w for w in workers if w.ready])


def _resend(op, state, workers, now, ttl_s) -> PrefixPlan:
    # The timer chose it from its view; recheck on the partition that owns the prefix.
    if state is None or not needs_resend(op.prefix_hash, state, workers, now, float("inf")):
        return PrefixPlan(state=state)
    others = [w for w in workers if w.worker_id != state.worker_id]
    # Another worker if there is one: the first one is gone, full, or lost the command.
    worker = choose_worker(others, [op.prefix_hash]) or choose_worker(workers, [op.prefix_hash])
    if worker is None:
        return PrefixPlan(state=state, counters={"no_worker": 1})
    new_state = state.model_copy(
        update={"worker_id": worker, "prefill_at": now, "resends": state.resends + 1}
    )
    ttl = max(1.0, state.expires_at - now)  # a resend does not lengthen the prefix's life
    cmd = _prefill(op, new_state, worker, ttl, state.hot, state.tier)  # where it was going
    return PrefixPlan(commands=[cmd], state=new_state, counters={"prefill_resends": 1})


def _cool(op, state, workers, now, ttl_s) -> PrefixPlan:
    """Unpin: the hot set let it go, or (`op.hold`) an edit's hold ended unasked. The
    worker keeps one pin, so a prefix still pinned for the other reason stays pinned."""
    if state is None or not (state.held_at is not None if op.hold else state.hot):
        return PrefixPlan(state=state)
    update = {"held_at": None} if op.hold else {"hot": False}
    still = state.hot if op.hold else state.held_at is not None
    cmd = WarmupCommand(
        command_id=command_id(),
        op="release",
        prefix_hash=op.prefix_hash,
        tenant=state.tenant,
        reason=op.reason or "cooled down",
    )
    return PrefixPlan(
        commands=[] if still else [cmd],
        state=state.model_copy(update=update),
        counters={} if still else {"releases": 1},
    )


def hold_ended(state: PrefixState, now: float, hold_s: float) -> bool:
    """Whether an edit's hold on the prefix lasted `hold_s` without the ask it was for."""
    return state.held_at is not None and state.held_at + hold_s <= now


def forgettable(
    prefix_hash: str,
    state: PrefixState,
    workers: Iterable[WorkerState],
    now: float,
    after_s: float = 0.0,
) -> bool:
    """Whether tracking the prefix is no use any more: expired `after_s` ago, not hot, and
    no worker (live or not) reports holding it. Such a state only keeps doc links alive; a
    later query of it registers it again."""
    return (
        state.expires_at + after_s <= now
        and not state.hot
        and not holders_of(prefix_hash, workers)
    )


def _forget(op, state, workers, now, ttl_s) -> PrefixPlan:
    # The sweep chose it from a possibly older view; a use since then keeps it.
    if state is None or not forgettable(op.prefix_hash, state, workers, now):
        return PrefixPlan(state=state)
    return PrefixPlan(
        state=None,
        links=_links(op.prefix_hash, state.chunk_refs, state.tenant, link=False),
        counters={"forgotten": 1},
    )


def _merge_questions(questions: Sequence[str], question: str | None) -> list[str]:
    merged = [q for q in questions if q != question]
    if question:
        merged.insert(0, question)
    return merged[:MAX_QUESTIONS_PER_PREFIX]


def _links(
    prefix_hash: str, refs: Iterable[ChunkRef], tenant: str, *, link: bool
) -> list[DocLink]:
    by_doc: dict[str, list[ChunkRef]] = {}
    for ref in refs:
        by_doc.setdefault(ref.doc_id, []).append(ref)
    return [
        DocLink(doc_id=d, tenant=tenant, prefix_hash=prefix_hash, chunk_refs=r, link=link)
        for d, r in sorted(by_doc.items())
    ]
