"""Synthetic warmup's handlers: ask a worker for questions about hot or just changed
documents, warm the top-3 prefixes of the questions it sends back, count real first asks
that hit one. The decisions are `streams.decide.synthetic`'s; this module only looks up and sends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from schemas import QueryEvent, WorkerEvent
from schemas.prefix import BLOCK_SIZE, prefix_kv_bytes, warm_hit
from streams.decide import logic
from streams.decide import synthetic as syn
from streams.decide.hot import HotTracker
from streams.decide.records import DocState, PrefixOp, WorkerState
from streams.handle.ports import RagPort, WarmPrefix
from streams.settings import StreamsSettings


class HandlerDeps(Protocol):
    """What these handlers use of `streams.handle.handlers.HandlerDeps` (which imports this
    module, so it is named here by shape)."""

    settings: StreamsSettings
    stats: Counter
    clock: Callable[[], float]
    tracker: HotTracker
    rag: RagPort
    synthetic: syn.SyntheticState

    @property
    def tables(self) -> Any: ...

    @property
    def out(self) -> Any: ...

    async def blocking(self, fn: Callable, *args): ...

    def live_workers(self) -> list[WorkerState]: ...

    def kv_bytes_per_token(self) -> int: ...


async def on_kb_changed(p: HandlerDeps, prior: DocState | None, state: DocState,
                        doc_id: str) -> None:
    """A document just got new content: ask a worker for questions about it."""
    if not p.settings.synthetic or not syn.changed_doc(prior, state):
        return
    candidate = syn.DocCandidate(state.tenant, doc_id, syn.doc_refs(state))
    for c in syn.due([candidate], p.synthetic.last_at, p.clock(), p.settings.synthetic_cooldown_s,
                     1):
        await request(p, c, "changed")


async def tick(p: HandlerDeps) -> int:
    """The hot documents not asked about lately, a few per tick; returns how many."""
    if not p.settings.synthetic:
        return 0
    now = p.clock()
    ranked = [r for r in p.tracker.ranked(now) if r[1] >= p.settings.hot_min_count]
    tenants = {h: payload.tenant for h, _, payload in ranked}
    docs = syn.hot_docs(((h, c, payload.chunk_refs) for h, c, payload in ranked), tenants)
    chosen = syn.due(docs, p.synthetic.last_at, now, p.settings.synthetic_cooldown_s,
                     p.settings.synthetic_docs_per_tick)
    sent = 0
    for c in chosen:
        sent += await request(p, c, "hot")
    return sent


async def request(p: HandlerDeps, c: syn.DocCandidate, why: str) -> int:
    """Send one `synthesize` command about `c` to the least loaded ready worker (1 if sent)."""
    s = p.settings
    prompt = await p.blocking(p.rag.synthesis_prompt, list(c.refs), c.tenant,
                              s.synthetic_source_tokens)
    workers = {w.worker_id: w for w in p.live_workers()}
    worker = logic.choose_worker(list(workers.values()), [])
    if prompt is None or worker is None:
        p.stats["synthetic_skipped"] += 1
        return 0
    p.synthetic.last_at[syn.doc_key_of(c)] = p.clock()
    per_token = p.kv_bytes_per_token()
    if not syn.sampling_fits(len(prompt.token_ids), s.synthetic_max_new_tokens, per_token,
                             workers[worker].mem_total, s.synthetic_share):
        p.stats["synthetic_over_share"] += 1  # the worker would refuse it
        return 0
    spec = syn.SynthesisSpec(s.synthetic_questions, s.synthetic_max_new_tokens,
                             s.synthetic_temperature, syn.sampling_seed(s.synthetic_seed, c),
                             s.synthetic_top_k)
    cmd = syn.synthesize_command(logic.command_id(), worker, c.tenant, prompt, spec,
                                 f"synthetic: {why} document {c.doc_id}")
    await p.out.command(logic.with_expiry(cmd, p.clock(), s.command_expiry_s))
    p.stats["synthetic_requests"] += 1
    return 1


async def on_synthesized(p: HandlerDeps, event: WorkerEvent) -> None:
    """A worker's questions: warm their top-3 prefixes on it, within its synthetic share."""
    if not p.settings.synthetic or not event.tenant:
        return
    tenant, now = event.tenant, p.clock()
    per_token = p.kv_bytes_per_token()
    prefixes: dict[str, WarmPrefix] = {}
    for question in event.questions:
        prefix = await p.blocking(p.rag.prefix_for_question, question, tenant)
        if prefix is not None:
            prefixes.setdefault(prefix.prefix_hash, prefix)
    held = p.synthetic.held.setdefault(event.worker_id, {})
    syn.prune(held, now)
    known = [h for h in prefixes if p.tables.prefixes.get(h)]
    row = p.tables.workers.get(event.worker_id) or {}
    cap = int(p.settings.synthetic_share * int(row.get("mem_total", 0)))
    sizes = [(h, prefix_kv_bytes(len(w.token_ids), per_token, BLOCK_SIZE))
             for h, w in prefixes.items()]
    chosen = syn.choose_prefixes(sizes, held, known, now, cap)
    p.stats["synthetic_questions"] += len(event.questions)
    p.stats["synthetic_already_warm"] += len(known)
    p.stats["synthetic_over_share"] += len(prefixes) - len(known) - len(chosen)
    for prefix_hash, nbytes in chosen:
        prefix = prefixes[prefix_hash]
        held[prefix_hash] = syn.Held(nbytes, now + p.settings.prefix_ttl_s)
        # Unpinned, no question recorded: an edit invalidates it (it is linked to its
        # chunks) but does not re-warm it; the worker's LRU may evict it first.
        await p.out.op(PrefixOp(
            op="warm_on", prefix_hash=prefix_hash, tenant=tenant, chunk_refs=prefix.chunk_refs,
            token_ids=prefix.token_ids, chunk_spans=prefix.chunk_spans,
            target_worker=event.worker_id, synthetic=True,
            reason="synthetic question",
        ))
        p.stats["synthetic_prefixes_warmed"] += 1


def count_query(p: HandlerDeps, query: QueryEvent) -> None:
    """Count a real question's first ask, and whether it hit a synthetic prefix."""
    if not p.settings.synthetic or not p.synthetic.asks.first(query.tenant, query.question):
        return
    p.stats["first_asks"] += 1
    state = p.tables.prefix_states.get(query.prefix_hash) if query.prefix_hash else None
    if state is not None and state.synthetic and warm_hit(
        query.cached_tokens, query.prefix_tokens, BLOCK_SIZE
    ):
        p.stats["synthetic_first_hits"] += 1
