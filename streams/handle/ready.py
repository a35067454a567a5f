"""A ready worker's re-warm: the tracked prefixes most used, into device memory in growing
steps (`streams.decide.progressive`), then the next ones into its KV tier below it."""

from __future__ import annotations

from schemas.prefix import prefix_kv_bytes
from streams.decide import logic, progressive
from streams.decide.records import PrefixOp, PrefixState, ReadyRewarm, WorkerState
from streams.handle.deps import HandlerDeps


def hot_sent(p: HandlerDeps) -> list[str]:
    """What a ready worker gets as the hot set, by the hash queries reported and the one its
    ops name (a newer prefix): the re-warm skips both."""
    return sorted(set(p.tracker.hot) | {op.prefix_hash for op in p.tracker.hot.values()})


async def next_warm_step(p: HandlerDeps, state: WorkerState) -> None:
    """After a heartbeat, the worker's next progressive step if one is pending and its KV
    use is within the threshold (`streams.decide.progressive`); above it, none of the rest."""
    if not state.warm_step:
        return
    step = progressive.next_step(state)
    following = state.warm_step + 1 if step is not None and step < state.warm_steps else 0
    update = {"warm_step": following}
    p.tables.worker_states[state.worker_id] = state.model_copy(update=update)
    # The tier's share goes with the last step, or alone when the steps stop (device memory
    # past the threshold says nothing of the tier's room).
    tier = tier_share(p, state) if following == 0 and state.ready else 0
    if step is None:
        p.stats["warm_steps_stopped"] += 1
        if not tier:
            return
    else:
        p.stats["warm_steps"] += 1
    await p.out.ready(ReadyRewarm(
        worker_id=state.worker_id, budget_bytes=state.warm_budget, skip=hot_sent(p),
        step=step or 0, steps=state.warm_steps, tier_bytes=tier,
    ))


def tier_share(p: HandlerDeps, worker: WorkerState) -> int:
    """Bytes of the worker's KV tier a ready re-warm may fill (0: off, or no tier)."""
    return progressive.tier_room(worker) if p.settings.tier_warmup else 0


async def on_ready_rewarm(p: HandlerDeps, req: ReadyRewarm) -> None:
    """Warm on `req.worker_id` the tracked prefixes most used of this partition (or of every
    local one) while they fit its share of the budget; least used first, so the worker's
    LRU evicts those before the ones most in use (they are unpinned). With `tier_bytes`,
    the next most used then go into its KV tier (`WarmupCommand.placement`)."""
    now = p.clock()
    per_token = p.kv_bytes_per_token()
    tracked = [
        (h, state) for h, state in p.tables.prefix_states.items()
        if req.partition is None or p.partition_of(h, req.partitions) == req.partition
    ]
    counts = {h: c for h, c, _ in p.tracker.ranked(now)}
    states = dict(tracked)
    parts = max(1, req.partitions if req.partition is not None else 1)
    planned = logic.plan_rewarm(tracked, now, req.budget_bytes // parts, per_token, req.skip,
                                counts)
    chosen = planned if req.step else []
    if req.steps > 1 and req.step:
        # Step `req.step` of the plan: the plan is made again at each step (the counts move a
        # little meanwhile; a prefix sent twice is a no-op on a worker holding it).
        sizes = [(h, prefix_kv_bytes(len(states[h].token_ids), per_token)) for h in planned]
        chosen = progressive.wave(sizes, req.budget_bytes // parts, req.step, req.steps)
    for prefix_hash in reversed(chosen):
        await _warm_on(p, req.worker_id, prefix_hash, states[prefix_hash], "worker ready")
    if req.tier_bytes:
        worker = p.tables.worker_states.get(req.worker_id)
        held = set(worker.prefixes) if worker is not None else set()
        skip = [*req.skip, *planned, *held]
        below = logic.plan_rewarm(tracked, now, req.tier_bytes // parts, per_token, skip, counts)
        for prefix_hash in below:  # most used first: the tier's LRU keeps those longest
            await _warm_on(p, req.worker_id, prefix_hash, states[prefix_hash],
                           "worker ready (KV tier)", tier=True)
        p.stats["ready_tier_warms"] += len(below)  # ragwarm_streams_decisions_total


async def _warm_on(p: HandlerDeps, worker_id: str, prefix_hash: str, state: PrefixState,
                   reason: str, *, tier: bool = False) -> None:
    await p.out.op(PrefixOp(
        op="warm_on", prefix_hash=prefix_hash, tenant=state.tenant,
        chunk_refs=state.chunk_refs, target_worker=worker_id, reason=reason, tier=tier,
    ))
