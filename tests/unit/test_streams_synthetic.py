"""Synthetic warmup through the streams handlers, over dict tables (no Kafka, no model)."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import ChunkRef, KbChange, QueryEvent, WarmupCommand, WorkerEvent
from streams.decide.hot import HotPayload, HotTracker
from streams.decide.records import DocState, PrefixOp, PrefixState, WorkerState, doc_key
from streams.decide.synthetic import SynthesisPrompt
from streams.handle import handlers, synthesize
from streams.handle.ports import WarmPrefix
from streams.settings import StreamsSettings
from streams.sim import run_sync

H = "1" * 64
TOKENS_PER_PREFIX = 32  # two blocks


def prefix_hash(question: str) -> str:
    return f"{abs(hash(question)) % 16**16:016x}" * 4


class Port:
    """A RAG port: every chunk named is current; each question retrieves its own prefix."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def index(self, change: KbChange) -> dict[str, str] | None:
        return {f"{change.doc_id}#0": H}

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        self.asked.append(question)
        refs = [ChunkRef(chunk_id=f"{question}#0", content_hash=H)]
        return WarmPrefix(prefix_hash(question), [5] * TOKENS_PER_PREFIX, refs)

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None:
        return None

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool:
        return True

    def synthesis_prompt(self, refs, tenant, max_tokens) -> SynthesisPrompt | None:
        return SynthesisPrompt([1, 2, 3], list(refs), primer_tokens=1)


class Outbox:
    def __init__(self) -> None:
        self.ops: list[PrefixOp] = []
        self.commands: list[WarmupCommand] = []

    async def op(self, op: PrefixOp) -> None:
        self.ops.append(op)

    async def link(self, link) -> None:
        return None

    async def command(self, cmd: WarmupCommand) -> None:
        self.commands.append(cmd)

    async def ready(self, req) -> None:
        return None


def pipeline(mem_total: int, **settings) -> tuple[handlers.HandlerDeps, Outbox]:
    out = Outbox()
    tables = handlers.StreamTables(docs={}, doc_prefixes={}, prefixes={}, workers={})
    worker = WorkerState(worker_id="w1", ready=True, mem_total=mem_total, last_seen=100.0,
                         epoch=1)
    tables.worker_states["w1"] = worker
    s = StreamsSettings(**({"synthetic": True, "kv_bytes_per_token": 10} | settings))
    p = handlers.HandlerDeps(tables=tables, out=out, rag=Port(), settings=s,
                             tracker=HotTracker(600.0, 60.0), clock=lambda: 100.0)
    return p, out


def change(doc_id: str = "a.md", version: int = 1) -> KbChange:
    return KbChange(op="upsert", doc_id=doc_id, version=version, text="x")


def test_a_changed_document_gets_one_synthesize_command_until_the_cooldown_passes():
    p, out = pipeline(10_000, synthetic_seed=3)
    run_sync(handlers.on_kb_change(p, change()))
    [cmd] = out.commands
    assert cmd.op == "synthesize" and cmd.worker_id == "w1"
    assert cmd.chunk_refs == [ChunkRef(chunk_id="a.md#0", content_hash=H)]
    assert (cmd.samples, cmd.temperature, cmd.top_k, cmd.primer_tokens) == (3, 1.3, 40, 1)
    assert cmd.seed is not None and cmd.expires_at is not None
    p.tables.doc_states[doc_key("default", "a.md")] = DocState(version=1, chunks={})
    run_sync(handlers.on_kb_change(p, change(version=2)))
    assert len(out.commands) == 1  # within the cooldown
    assert p.stats["synthetic_requests"] == 1


def test_nothing_is_synthesized_when_the_setting_is_off():
    p, out = pipeline(10_000, synthetic=False)
    run_sync(handlers.on_kb_change(p, change()))
    run_sync(synthesize.tick(p))
    assert out.commands == []


def test_hot_documents_are_asked_about_on_the_tick():
    p, out = pipeline(10_000, synthetic_docs_per_tick=1)
    refs = (ChunkRef(chunk_id="hot.md#0", content_hash=H),)
    for _ in range(3):
        p.tracker.observe("c" * 64, HotPayload("default", "q", refs, 32), 100.0)
    assert run_sync(synthesize.tick(p)) == 1
    assert [c.chunk_refs[0].chunk_id for c in out.commands] == ["hot.md#0"]
    assert run_sync(synthesize.tick(p)) == 0  # cooldown


def synthesized(questions: list[str]) -> WorkerEvent:
    return WorkerEvent(worker_id="w1", kind="synthesized", tenant="default",
                       questions=questions, epoch=1)


def test_synthesized_questions_warm_their_prefixes_on_that_worker_within_the_share():
    # 5% of 20,000 bytes = 1,000 bytes: three prefixes of 32 tokens x 10 bytes fit, not four.
    p, out = pipeline(20_000)
    run_sync(handlers.on_worker_event(p, synthesized(["q1?", "q2?", "q3?", "q4?"])))
    assert [op.op for op in out.ops] == ["warm_on"] * 3
    assert all(op.synthetic and op.target_worker == "w1" and not op.pin for op in out.ops)
    assert p.stats["synthetic_prefixes_warmed"] == 3
    assert p.stats["synthetic_over_share"] == 1
    # The prefix op marks the state synthetic and sends the prefill to that worker.
    run_sync(handlers.on_prefix_op(p, out.ops[0]))
    state = p.tables.prefix_states[out.ops[0].prefix_hash]
    assert state.synthetic and state.questions == []


def test_a_first_ask_served_from_a_synthetic_prefix_is_counted_once():
    p, _ = pipeline(20_000)
    h = prefix_hash("q1?")
    p.tables.prefixes[h] = PrefixState(tenant="default", chunk_refs=[], token_ids=[5] * 32,
                                       expires_at=500.0, synthetic=True).model_dump()
    ask = QueryEvent(question="How do I X?", prefix_hash=h, prefix_tokens=40, cached_tokens=32)
    synthesize.count_query(p, ask)
    synthesize.count_query(p, ask)  # a repeat is no first ask
    other = QueryEvent(question="Other?", prefix_hash=h, prefix_tokens=40, cached_tokens=16)
    synthesize.count_query(p, other)  # a partial hit does not count
    assert (p.stats["first_asks"], p.stats["synthetic_first_hits"]) == (2, 1)


def test_no_command_goes_to_a_worker_whose_share_cannot_hold_the_sampling():
    # (3 prompt + 24 new tokens) x 10 bytes = 270 bytes > 5% of 5,000.
    p, out = pipeline(5_000)
    run_sync(handlers.on_kb_change(p, change()))
    assert out.commands == [] and p.stats["synthetic_over_share"] == 1
