"""The simulated-clock runner: one pass over the timeline, every policy in lockstep, for real.

The KB is indexed once into one shared Qdrant store and each query is retrieved once; then
every policy's worker (its own KV cache, the shared model weights) answers the same prompt
and its TTFT is measured on the torch engine. Policies react to the same KB changes.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rag.index import Indexer
from rag.prompt import Prompt, PromptBuilder
from rag.retrieve import Retriever
from rag.settings import QdrantSettings, RagSettings
from rag.store import ChunkStore
from ragwarm.bench.strategies import workload as wl
from ragwarm.bench.strategies.lanes import Lane, SimClock, open_lane, store_rag
from ragwarm.bench.strategies.policies import policy_class, policy_names
from ragwarm.bench.strategies.records import QueryRow, Span, reuse_check
from ragwarm.bench.strategies.restart import restart_step
from ragwarm.bench.strategies.settings import StrategySettings
from ragwarm.bench.strategies.tiered import open_sim_tier
from ragwarm.rag_port import RagService
from ragwarm.trace import Question, TraceEvent
from schemas import KbChange, QueryEvent
from schemas.prefix import (
    PromptChain,
    aligned_tokens,
    prefix_chain,
    prefix_kv_bytes,
    warm_hit,
)
from workers.cost_engine import CostEngine, CostModel, make_cache
from workers.engines.protocol import GenerateRequest
from workers.engines.tiers import open_tier
from workers.engines.torch_engine import TorchEngine
from workers.kv.chunk_kv import ChunkSpan
from workers.kv.memory import DEFAULT_MAX_ENTRIES, Budget
from workers.settings import WorkerSettings
from workers.sim import MeasurementMemo, Measurements, SimAnswer


@dataclass
class Rig:
    """What all policies share: the model, the store and the RAG layer over it."""

    base: TorchEngine  # holds the weights every policy's engine shares
    worker_settings: WorkerSettings
    store: ChunkStore
    indexer: Indexer
    retriever: Retriever
    prompts: PromptBuilder
    rag: RagService
    tenant: str
    # Model-free (`--model-free`): each policy's worker runs on the cost engine, the same
    # cache bookkeeping with TTFT estimated by this model; retrieval stays real.
    cost: CostModel | None = None


@dataclass
class RunResult:
    rows: list[QueryRow]
    policies: dict[str, dict[str, Any]]
    kb_times: list[float]
    queries: int
    kb_events: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prepared:
    """A query retrieved and built once, shared by every policy."""

    step: wl.QueryStep
    prompt: Prompt
    spans: list[Span]
    chain: PromptChain
    doc_ids: list[str]


def open_rig(settings: StrategySettings, store_dir: Path, chunk_tokens: int,
             cost: CostModel | None = None) -> Rig:
    """Load the LLM once and open a fresh local store; raises `ModelMissing` without models.
    With `cost` the weights serve only their tokenizer and KV sizes (model-free run)."""
    from ragwarm.models import llm_dir, load_embedder
    from workers.engines.torch_engine import load_torch_engine

    worker = WorkerSettings(threads=settings.threads or 1)
    base = load_torch_engine(llm_dir(), worker)
    rag_settings = RagSettings()
    embedder = load_embedder(
        batch_size=rag_settings.embed_batch_size, precision=rag_settings.embed_precision
    )
    store = ChunkStore.open(QdrantSettings(path=store_dir), "strategies", embedder.dim)
    indexer = Indexer(store, embedder, base.tokenizer, chunk_tokens, 0)
    retriever = Retriever(store, embedder, rag_settings.top_k)
    prompts = PromptBuilder(base.tokenizer, rag_settings.system_prompt)
    rag = RagService(store, indexer, retriever, prompts, base.model_id, base.block_size)
    if cost is None:
        # One untimed forward first: lazy initialisation must not land in a policy's TTFT.
        base.prefill(base.tokenize("warm up " * 40), tenant="warmup")
    return Rig(base, worker, store, indexer, retriever, prompts, rag, settings.tenant, cost)


def prompt_spans(prompt: Prompt) -> list[Span]:
    """Each chunk of `prompt` with where its block sits (the prompt's own `chunk_spans`)."""
    return [(ref, a, b) for ref, (a, b) in zip(prompt.chunk_refs, prompt.chunk_spans, strict=True)]


class Runner:
    """Builds the workload and drives every policy through it."""

    def __init__(self, rig: Rig, settings: StrategySettings, names: Sequence[str],
                 progress: bool | None = None, tier_root: Path | None = None,
                 share_queries: bool = False) -> None:
        self.rig = rig
        self.memo = MeasurementMemo(across_queries=share_queries)
        self.tier_root = tier_root  # one folder per policy with a disk tier, kept on restart
        self.budget = Budget(max_bytes=0, max_entries=DEFAULT_MAX_ENTRIES, warm_bytes=0)
        self.boots: dict[str, dict[str, Any]] = {}  # per policy, what its restart did
        self.restart_at: float | None = None
        self.since_restart: int | None = None
        self.settings = settings
        self.names = list(names)
        self.progress = progress
        self.clock = SimClock()
        self.lanes: dict[str, Lane] = {}
        self.rows: list[QueryRow] = []
        self.kb_times: list[float] = []
        self.deps: dict[str, set[str]] = {}
        self.pending: set[str] = set()
        self.measured: Counter[str] = Counter()

    # -- setup ---------------------------------------------------------------------

    def index_initial(self, initial: Sequence[TraceEvent]) -> float:
        started = time.perf_counter()
        _say(f"indexing the initial state: {len(initial)} documents")
        self.rig.indexer.index_documents([e.to_change(self.rig.tenant) for e in initial])
        return time.perf_counter() - started

    def survey(self, live: Sequence[Question]) -> tuple[dict[str, frozenset[str]], int]:
        """Docs each live question depends on (named or retrieved at the start), and the
        bytes of their distinct prefixes."""
        retrievals = self.rig.retriever.retrieve_many([q.question for q in live], self.rig.tenant)
        prefixes: dict[str, int] = {}
        deps: dict[str, frozenset[str]] = {}
        for q, r in zip(live, retrievals, strict=True):
            deps[q.qid] = q.answer_docs | frozenset(r.doc_ids)
            tokens = self.rig.prompts.build_prefix(r.chunks)
            prefix_hash = self.prefix_chain(tokens).prefix_hash
            if prefix_hash is not None:
                prefixes[prefix_hash] = len(tokens)
        base = self.rig.base
        block = base.block_size
        total = sum(prefix_kv_bytes(n, base.kv_bytes_per_token, block) for n in prefixes.values())
        return deps, total

    def prefix_chain(self, prefix_ids: Sequence[int]) -> PromptChain:
        """The prefix's chain as workers and the streams app compute it."""
        base = self.rig.base
        return prefix_chain(prefix_ids, tenant=self.rig.tenant, model=base.model_id,
                            block_size=base.block_size)

    def open_lanes(self, budget: Budget, past: Sequence[Question],
                   log: Sequence[tuple[float, Question]] = ()) -> None:
        rag = store_rag(self.rig.rag)
        self.budget = budget
        for name in self.names:
            self.lanes[name] = open_lane(policy_class(name), self.engine_for(name), self.clock,
                                         rag, self.settings, past,
                                         ttft_runs=self.settings.ttft_runs)
        self.replay_log(log)
        self.clock.now = 0.0
        for lane in tqdm(self.lanes.values(), desc="policy start", disable=self._quiet()):
            lane.policy.start()
            # The first warmup happens before the worker takes traffic (it reports ready
            # first); a restart's re-warm, by contrast, delays the requests behind it.
            lane.worker.idle()

    def engine_for(self, name: str) -> TorchEngine | CostEngine:
        """A booting worker's engine for policy `name`: an empty cache on the shared weights,
        and the disk tier the policy keeps (its folder scanned, as at a worker's boot); in a
        model-free run, an empty cache on the cost engine."""
        base, tier, cls = self.rig.base, None, policy_class(name)
        eviction = cls.eviction_on(self.rig.worker_settings.eviction_policy,
                                   same=self.settings.same_eviction)
        worker = self.rig.worker_settings
        cache = make_cache(self.budget, self.clock, worker.block_size, eviction,
                           cls.request_caching(worker.request_caching))
        host_bytes = self.host_tier_bytes() if cls.host_tier and not cls.disk_tier else 0
        if self.rig.cost is not None:
            return CostEngine(self.rig.cost, cache, model_id=base.model_id,
                              kv_bytes_per_token=base.kv_bytes_per_token, tier_bytes=host_bytes)
        # Chunk reuse as the worker's setting turns it on: default share and selection.
        settings = self.rig.worker_settings.model_copy(update={
            "host_tier_bytes": host_bytes, **({"chunk_reuse": True} if cls.chunk_reuse else {}),
        })
        if host_bytes:
            tier = open_tier(base.model, settings, None)
        if cls.disk_tier:
            if self.tier_root is None:
                raise ValueError(f"policy {name!r} keeps a disk tier: give the runner a folder")
            tier_bytes = int(self.settings.tiered_disk_share * self.budget.max_bytes)
            tier = open_sim_tier(base.model, settings, self.tier_root / name, tier_bytes)
        return TorchEngine(base.model, base.tokenizer, model_id=base.model_id,
                           settings=settings, cache=cache, tier=tier)

    def host_tier_bytes(self) -> int:
        """The host tier of a policy keeping the worker's default one: the worker's setting,
        unset sized on the run's KV budget as a worker's is on its own."""
        return self.rig.worker_settings.host_tier_for(self.budget.max_bytes)

    def restart(self) -> None:
        """Every worker restarts mid-run (a crash: no flush) on the same disk, and gets the
        warmup its policy gives a worker that boots (`start`, e.g. the app's ready re-warm)."""
        _say(f"restart: every worker, at {self.clock.now / 60:.1f} simulated minutes")
        self.restart_at, self.since_restart = self.clock.now, 0
        for name, lane in self.lanes.items():
            engine = self.engine_for(name)
            tier = getattr(engine, "tier", None)  # the cost engine keeps none
            before = lane.worker.warm_seconds
            lane.worker.restart(engine)
            lane.policy.start()
            self.boots[name] = {
                "tier_blocks": len(tier.index) if tier is not None else None,
                "rewarm_seconds": round(lane.worker.warm_seconds - before, 2),
            }

    def replay_log(self, log: Sequence[tuple[float, Question]]) -> None:
        """Yesterday's answered queries, at their (negative) times, to every policy."""
        events: dict[str, QueryEvent] = {}
        for at, question in tqdm(log, desc="yesterday's log", disable=self._quiet()):
            if question.qid not in events:
                events[question.qid] = self.logged_event(question)
            self.clock.now = at
            for lane in self.lanes.values():
                lane.policy.logged(events[question.qid])

    def logged_event(self, question: Question) -> QueryEvent:
        """What the RAG client published for `question` on the start-of-run KB."""
        retrieval = self.rig.retriever.retrieve(question.question, self.rig.tenant)
        prompt = self.rig.prompts.build(retrieval.chunks, question.question)
        chain = self.prefix_chain(prompt.prefix_ids)
        return QueryEvent(
            tenant=self.rig.tenant, question=question.question, qid=question.qid,
            chunk_refs=list(prompt.chunk_refs), prefix_hash=chain.prefix_hash,
            block_hashes=list(chain.prefix_hashes), prefix_tokens=prompt.prefix_len,
            prompt_tokens=len(prompt.token_ids), cached_tokens=0, worker_id="yesterday",
        )

    # -- the timeline --------------------------------------------------------------

    def run(self, steps: Sequence[wl.Step]) -> None:
        restart = restart_step(steps, self.settings.restart_at)
        bar = tqdm(steps, desc="timeline", unit="step", disable=self._quiet())
        # Without a terminal tqdm stays silent; a run takes minutes, so say something.
        every = max(1, len(steps) // 10) if bar.disable and self.progress is None else 0
        started = time.monotonic()
        for done, step in enumerate(bar, 1):
            self.clock.now = step.at
            if done - 1 == restart:
                self.restart()
            for lane in self.lanes.values():
                lane.worker.expire()
                lane.policy.tick(step.at)
            if isinstance(step, wl.KbStep):
                self.kb_step(step.event)
            else:
                self.query_step(step)
            if every and (done % every == 0 or done == len(steps)):
                _say(f"timeline: {done}/{len(steps)} steps, {time.monotonic() - started:.0f} s")

    def kb_step(self, event: TraceEvent) -> None:
        change: KbChange = event.to_change(self.rig.tenant)
        result = self.rig.indexer.index_document(change)
        if result.content_changed:
            self.kb_times.append(self.clock.now)
            self.pending |= {qid for qid, docs in self.deps.items() if change.doc_id in docs}
        for lane in self.lanes.values():
            lane.policy.kb_change(change, result)

    def query_step(self, step: wl.QueryStep) -> None:
        query = self.prepare(step)
        qid = step.question.qid
        post_edit = qid in self.pending
        repeat = qid in self.deps
        self.pending.discard(qid)
        self.deps[qid] = set(step.question.answer_docs) | set(query.doc_ids)
        # Rotate who goes first, so no policy always runs right after the same neighbour.
        turn = step.index % len(self.names)
        names = self.names[turn:] + self.names[:turn]
        shared = self.memo.for_query(query.prompt.token_ids)
        made, reused = len(shared), shared.reused
        spans = [ChunkSpan((r.chunk_id, r.content_hash), a, b) for r, a, b in query.spans]
        answers = []
        for name in names:
            lane = self.lanes[name]
            served = lane.worker.serve(query.prompt.token_ids, self.rig.tenant,
                                       query.prompt.chunk_refs, shared, spans)
            answers.append((self.row(name, lane, query, served, post_edit, repeat), served))
            lane.policy.served(self.event(query, served, name))
        self.rows.extend(self.judge_blends(query, answers, shared))
        self.measured["measurements"] += len(shared) - made
        self.measured["shared_requests"] += shared.reused - reused
        if self.since_restart is not None:
            self.since_restart += 1

    def judge_blends(self, q: Prepared, answers: list[tuple[QueryRow, SimAnswer]],
                     shared: Measurements) -> list[QueryRow]:
        """Rows whose KV a blend made (blended now, or read from a blended answer stored
        earlier), with whether their first token is the one the exact computation gives
        (a measurement of another policy when there is one, else a full prefill on the
        shared weights, untimed). Model-free, no answer computes a token: none is judged."""
        rows = [row for row, _ in answers]
        if self.rig.cost is not None or not any(r.approximate for r in rows):
            return rows
        exact = next((m.result for m in shared.values() if m.result.token_ids), None)
        if exact is None:
            steps = self.rig.base.generate(GenerateRequest(q.prompt.token_ids, max_tokens=1,
                                           tenant=f"{self.rig.tenant}-reference"))
            exact = next(s.result for s in steps if s.result is not None)
            self.measured["reference_runs"] += 1
        first = exact.token_ids[:1]
        return [replace(r, first_token_agrees=a.result.token_ids[:1] == first)
                if r.approximate else r for r, a in answers]

    def prepare(self, step: wl.QueryStep) -> Prepared:
        retrieval = self.rig.retriever.retrieve(step.question.question, self.rig.tenant)
        prompt = self.rig.prompts.build(retrieval.chunks, step.question.question)
        spans = prompt_spans(prompt)
        chain = self.prefix_chain(prompt.prefix_ids)
        return Prepared(step, prompt, spans, chain, retrieval.doc_ids)

    def row(self, name: str, lane: Lane, q: Prepared, served: SimAnswer, post_edit: bool,
            repeat: bool) -> QueryRow:
        result, cache = served.result, lane.worker.cache
        block = lane.worker.engine.block_size
        aligned = aligned_tokens(q.prompt.prefix_len, block)
        cached = result.cached_tokens
        stale, outdated = reuse_check(served.entry_refs, q.spans, cached, self._current)
        total = cache.budget.max_bytes or 1
        tier = lane.worker.engine.tier_state()[1] if lane.policy.disk_tier else None
        return QueryRow(
            policy=name, index=q.step.index, at=q.step.at, qid=q.step.question.qid,
            burst=q.step.burst, post_edit=post_edit, repeat=repeat, ttft_ms=served.ttft_s * 1000,
            prompt_tokens=result.prompt_tokens, prefix_tokens=q.prompt.prefix_len,
            cached_tokens=cached, hit=warm_hit(cached, q.prompt.prefix_len, block),
            partial=0 < cached < aligned, stale=stale, outdated_partial=outdated,
            mem_share=cache.bytes_used / total, pinned_share=cache.pinned_bytes / total,
            disk_share=None if tier is None else tier / total, restored=served.restored,
            since_restart=self.since_restart, blended_tokens=result.blended_tokens,
            approx_cached_tokens=result.approx_cached_tokens,
            queued_ms=served.queued_s * 1000,
            chunk_tokens_held=served.chunk_kv[0], chunk_tokens=served.chunk_kv[1],
            prefix_hash=q.chain.prefix_hash,
        )

    def event(self, q: Prepared, served: SimAnswer, name: str) -> QueryEvent:
        """The record the RAG client would publish on `rag.queries` for this answer."""
        r = served.result
        return QueryEvent(
            tenant=self.rig.tenant, question=q.step.question.question, qid=q.step.question.qid,
            chunk_refs=list(q.prompt.chunk_refs), prefix_hash=q.chain.prefix_hash,
            block_hashes=list(q.chain.prefix_hashes),
            prefix_tokens=q.prompt.prefix_len, prompt_tokens=r.prompt_tokens,
            cached_tokens=r.cached_tokens, ttft_ms=r.ttft_s * 1000, worker_id=f"sim-{name}",
        )

    def _current(self, chunk_ids: list[str]) -> dict[str, str]:
        found = self.rig.store.get_chunks(chunk_ids, self.rig.tenant)
        return {cid: s.chunk.content_hash for cid, s in found.items()}

    def _quiet(self) -> bool | None:
        return None if self.progress is None else not self.progress

    # -- results -------------------------------------------------------------------

    def measure_counts(self) -> dict[str, int]:
        """Distinct TTFT measurements (each `ttft_runs` engine runs), requests served, those
        that reused another policy's measurement, the engine runs not timed (deployed runs
        of shared measurements, full prefills judging blended answers), and requests read
        back from a disk tier (one timed run each, never shared)."""
        workers = [lane.worker for lane in self.lanes.values()]
        reruns = sum(w.reruns for w in workers) + self.measured["reference_runs"]
        own = sum(w.own_measurements for w in workers)
        return {"measurements": self.measured["measurements"] + own, "requests": len(self.rows),
                "shared_requests": self.measured["shared_requests"], "untimed_runs": reruns,
                "restore_runs": sum(w.restore_runs for w in workers)}

    def policy_figures(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, lane in self.lanes.items():
            stats = getattr(lane.policy, "stats", {})
            out[name] = {
                "warmup_seconds": lane.worker.warm_seconds,
                # Simulated seconds the worker spent prefilling, and requests waited for it.
                "warmup_busy_s": round(lane.worker.busy_seconds, 2),
                "queued_s": round(lane.worker.queued_seconds, 2),
                "commands": dict(lane.worker.outcomes),
                "streams": dict(stats),
                "figures": lane.policy.figures(),
            }
        return out


def run_benchmark(
    events: Sequence[TraceEvent],
    questions: Sequence[Question],
    settings: StrategySettings,
    rig: Rig,
    *,
    edits: int | None,
    queries: int,
    docs: int | None = None,
    sample: int | None = None,
    names: Sequence[str] | None = None,
    progress: bool | None = None,
    tier_root: Path | None = None,
    share_queries: bool = False,
) -> RunResult:
    """Index, build the workload, run every policy; the figures come from `RunResult.rows`.

    With `sample`, that many questions are drawn first and the initial state is cut to
    their documents plus distractors up to `docs`, so a large KB indexes a slice only.
    Policies keeping a disk tier keep it under `tier_root` (one folder each). With
    `share_queries` a request may reuse an earlier query's measurement of the same
    computation, not only another policy's for the same query.
    """
    started = time.perf_counter()
    initial, rest = wl.split_trace(events)
    initial_seq = initial[-1].seq if initial else -1
    rng = random.Random(settings.seed)
    if sample is not None:
        edited = {e.doc_id for e in wl.content_changes(initial, rest)}
        questions = wl.sample_questions(questions, edited, sample, docs or len(initial), rng)
    initial = wl.kb_slice(initial, questions, docs, rng)
    runner = Runner(rig, settings, names or policy_names(), progress, tier_root, share_queries)
    index_s = runner.index_initial(initial)
    deps, prefix_bytes = runner.survey([q for q in questions if q.live_at(initial_seq)])
    relevant = set().union(*deps.values()) if deps else set()
    chosen = wl.relevant_edits(rest, relevant, edits, initial)
    budget_bytes = int(settings.memory_share * prefix_bytes)
    budget = Budget(max_bytes=budget_bytes, max_entries=DEFAULT_MAX_ENTRIES,
                    warm_bytes=budget_bytes)
    steps, log = _workload(settings, questions, chosen, initial_seq, queries, deps)
    runner.open_lanes(budget, wl.by_popularity([q for _, q in log]), log)
    runner.run(steps)
    n_queries = sum(isinstance(s, wl.QueryStep) for s in steps)
    meta: dict[str, Any] = {
        "memory_share": settings.memory_share, "budget_bytes": budget_bytes,
        "distinct_prefix_bytes": prefix_bytes, "host_tier_bytes": runner.host_tier_bytes(),
        "initial_docs": len(initial), "questions": len(questions),
        "content_edits": len(wl.content_changes(initial, chosen)),
        "index_seconds": round(index_s, 1),
        "elapsed_seconds": round(time.perf_counter() - started, 1),
        "duration_sim_s": round(steps[-1].at, 1) if steps else 0.0,
        "shared_across_queries": share_queries,
        "scenario": "post-edit-asks" if settings.post_edit_asks else "drawn",
        "same_eviction": settings.same_eviction,
    } | runner.measure_counts()
    if runner.restart_at is not None:
        meta["restart"] = {"at_s": round(runner.restart_at, 1), "boots": runner.boots,
                           "window": settings.restart_window}
    return RunResult(runner.rows, runner.policy_figures(), runner.kb_times, n_queries,
                     len(chosen), meta)


def _workload(
    settings: StrategySettings, questions: Sequence[Question], edits: Sequence[TraceEvent],
    initial_seq: int, queries: int, deps: Mapping[str, frozenset[str]] | None = None,
) -> tuple[list[wl.Step], list[tuple[float, Question]]]:
    """Today's timeline, and yesterday's log: as many draws as `history_queries`, on the
    same arrival process, ending one mean gap before today's first query."""
    rng = random.Random(settings.seed)
    weights = wl.zipf_weights([q.qid for q in questions], settings.zipf_s, rng)
    arrivals = wl.arrivals(queries, rng, settings.mean_gap_s, settings.burst_prob,
                           settings.burst_size, settings.burst_gap_s)
    steps = wl.timeline(arrivals, edits, questions, weights, initial_seq, rng,
                        settings.edits_from, deps, post_edit_asks=settings.post_edit_asks)
    yesterday = random.Random(settings.seed + 1)
    log = wl.past_log(questions, weights, initial_seq, settings.history_queries, yesterday)
    times = wl.arrivals(len(log), yesterday, settings.mean_gap_s, settings.burst_prob,
                        settings.burst_size, settings.burst_gap_s)
    end = times[-1].at + settings.mean_gap_s if times else 0.0
    return steps, [(a.at - end, q) for a, q in zip(times, log, strict=True)]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
