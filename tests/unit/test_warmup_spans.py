"""A warmup prefill carries where its chunks stand (`WarmupCommand` v5 `chunk_spans`): the
schema checks them, the prompt builder and the streams app fill them, and the worker's
prefill donates the chunks' KV on arrival, so a first ask finds them before any request
hit the warm prefix."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest

from rag.prompt import PromptBuilder, canonical_order
from schemas import ChunkRef, SchemaError, WarmupCommand, decode, encode
from schemas.events import ChunkSpan, WarmupCommandV4
from streams.decide.logic import plan_prefix_op
from streams.decide.records import PrefixOp, PrefixState, WorkerState
from tests.unit.conftest import WordTokenizer
from workers.cost_engine import CostEngine, CostModel, make_cache
from workers.kv import chunk_kv
from workers.kv.memory import Budget
from workers.sim import SimWorker

BLOCK = 16
H = ["a" * 64, "b" * 64, "c" * 64]
REFS = [ChunkRef(chunk_id=f"d.md#{i}", content_hash=H[i]) for i in range(3)]


def span(i: int, start: int, end: int) -> ChunkSpan:
    return ChunkSpan(chunk_id=REFS[i].chunk_id, content_hash=H[i], start=start, end=end)


def prefill(spans: list[ChunkSpan], n_tokens: int = 100, **kw) -> WarmupCommand:
    fields = {"command_id": "c", "op": "prefill", "tenant": "t", "token_ids": [1] * n_tokens,
              "chunk_refs": REFS, "chunk_spans": spans} | kw
    return WarmupCommand(**fields)


# --- the schema ------------------------------------------------------------------------


def test_spans_round_trip_and_a_v4_prefill_reads_with_none() -> None:
    cmd = prefill([span(0, 10, 30), span(2, 30, 55)])
    back = decode(encode(cmd), WarmupCommand)
    assert back.chunk_spans == cmd.chunk_spans and back.schema_version == WarmupCommand.VERSION
    old = decode(encode(WarmupCommandV4(command_id="c", op="prefill", token_ids=[1, 2])))
    assert type(old) is WarmupCommand and old.chunk_spans == []


@pytest.mark.parametrize(("spans", "why"), [
    ([span(0, 30, 50), span(1, 10, 20)], "out of order"),
    ([span(0, 10, 30), span(1, 29, 40)], "overlap"),
    ([span(0, 90, 101)], "past the prompt"),
    ([span(0, 20, 20)], "empty span"),
])
def test_spans_must_be_ordered_disjoint_and_inside_the_prompt(spans, why) -> None:
    with pytest.raises(ValueError, match=why):
        prefill(spans)


def test_a_span_names_a_chunk_of_the_command_and_only_a_prefill_has_spans() -> None:
    stranger = ChunkSpan(chunk_id="other#0", content_hash="d" * 64, start=0, end=5)
    with pytest.raises(ValueError, match="not in chunk_refs"):
        prefill([stranger])
    with pytest.raises(ValueError, match="only op 'prefill'"):
        prefill([span(0, 0, 5)], op="invalidate")
    raw = encode(prefill([span(0, 10, 30)])).replace(b'"start":10', b'"start":40')
    with pytest.raises(SchemaError) as err:  # a consumer names the field (dead letter)
        decode(raw, WarmupCommand)
    assert err.value.field == "chunk_spans"


# --- the prompt builder ---------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    text: str

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def test_the_prefix_spans_are_the_prompts_and_hold_each_chunks_block() -> None:
    builder = PromptBuilder(WordTokenizer(), "Answer from the context.")
    chunks = [Chunk("b.md#2", "beta two words"), Chunk("a.md#1", "alpha one has more words")]
    tokens, spans = builder.prefix_with_spans(chunks)
    assert tokens == builder.build_prefix(chunks)
    assert spans == builder.build(chunks, "why?").chunk_spans
    for chunk, (a, b) in zip(canonical_order(chunks), spans, strict=True):
        assert tokens[a:b] == builder.chunk_ids(chunk)


# --- the streams app's decision ---------------------------------------------------------


def ready(wid: str = "w1") -> WorkerState:
    return WorkerState(worker_id=wid, ready=True, mem_total=100)


def test_a_warm_prefill_carries_the_prefix_spans_and_an_older_state_learns_them() -> None:
    spans = [span(0, 10, 30), span(1, 30, 55)]
    op = PrefixOp(op="warm", prefix_hash="f" * 32, tenant="t", chunk_refs=REFS[:2],
                  token_ids=[1] * 60, chunk_spans=spans, question="q")
    plan = plan_prefix_op(op, None, [ready()], now=1.0, ttl_s=60)
    (cmd,) = plan.commands
    assert cmd.op == "prefill" and cmd.chunk_spans == spans
    assert plan.state is not None and plan.state.chunk_spans == spans
    older = PrefixState(tenant="t", chunk_refs=REFS[:2], token_ids=[1] * 60, expires_at=0.0)
    assert older.chunk_spans == []  # a table record written before v5
    plan = plan_prefix_op(op, older, [ready()], now=1.0, ttl_s=60)
    assert plan.commands[0].chunk_spans == spans


# --- the worker ---------------------------------------------------------------------------

OPENING = list(range(1000, 1020))
CHUNK_IDS = [[(i + 1) * 10_000 + t for t in range(5 * BLOCK + 3)] for i in range(3)]


def prompt(order: list[int]) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Opening, the chunks in `order`, a question; and (chunk, start, end) of each."""
    tokens, places = list(OPENING), []
    for i in order:
        places.append((i, len(tokens), len(tokens) + len(CHUNK_IDS[i])))
        tokens += CHUNK_IDS[i]
    return tokens + [90_000] * 12, places


def sim_worker() -> SimWorker:
    clock = lambda: 0.0  # noqa: E731
    cache = make_cache(Budget(10**9, 1000, 10**9), clock, BLOCK, "lru")
    engine = CostEngine(CostModel(100.0, 1.0), cache, model_id="m", kv_bytes_per_token=1)
    return SimWorker(engine, clock, worker_id="w", cache_requests=True)


def held_for_new_prompt(worker: SimWorker) -> tuple[int, int]:
    """Chunk tokens of a never-asked prompt (chunks 2, 0, 1) that stored prompts hold."""
    tokens, places = prompt([2, 0, 1])
    spans = [chunk_kv.ChunkSpan((REFS[i].chunk_id, H[i]), a, b) for i, a, b in places]
    return worker.engine.chunk_kv_available(tokens, spans, tenant="t", cached=0)


@pytest.mark.parametrize("with_spans", [True, False])
def test_a_warmup_prefill_donates_its_chunks_only_when_it_carries_their_places(
    with_spans: bool,
) -> None:
    worker = sim_worker()
    tokens, places = prompt([0, 1, 2])
    warm = tokens[: places[-1][2] + 4]  # the prefix: through the last chunk, and a bit
    spans = [span(i, a, b) for i, a, b in places] if with_spans else []
    outcome = worker.apply(prefill(spans, token_ids=warm, worker_id="w", pin=True))
    assert outcome == "stored"
    held, total = held_for_new_prompt(worker)
    assert total == sum(map(len, CHUNK_IDS))
    if with_spans:
        # The prefix's whole blocks (272 of its 273 tokens) hold every chunk to its end.
        assert len(warm) // BLOCK * BLOCK >= places[-1][2]
        assert held == total
    else:
        assert held == 0  # nothing offered until a request that knows them hits it
