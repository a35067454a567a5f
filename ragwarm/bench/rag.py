"""`ragwarm bench rag`: ingest a trace's initial state, measure retrieval, replay the rest."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ragwarm.trace import (
    Question,
    TraceError,
    TraceEvent,
    read_events,
    read_questions,
    split_initial,
)

if TYPE_CHECKING:
    from rag.chunking import Tokenizer
    from rag.embed import Embedder
    from rag.index import Indexer
    from rag.prompt import PromptBuilder
    from rag.retrieve import Retriever
    from rag.settings import RagSettings


@dataclass
class RagBench:
    """The figures `ragwarm bench rag` prints; the first eight are its `--json` contract."""

    chunks: int = 0
    ingest_chunks_per_s: float = 0.0
    query_ms_p50: float = 0.0
    recall_at_3: float = 0.0
    questions: int = 0
    replay_events: int = 0
    embeddings_computed: int = 0
    embeddings_naive: int = 0
    ingest_s: float = 0.0
    replay_s: float = 0.0
    chunks_final: int = 0
    recall_at_3_final: float = 0.0
    questions_final: int = 0
    prefix_tokens_p50: float = 0.0


def judged_questions(questions: Sequence[Question], seq: int) -> list[Question]:
    """Questions that exist once events up to `seq` are applied and name an answering doc."""
    return [q for q in questions if q.answer_docs and q.live_at(seq)]


def hit(question: Question, doc_ids: Sequence[str]) -> bool:
    return bool(question.answer_docs & set(doc_ids))


def recall(questions: Sequence[Question], retrieved: Sequence[Sequence[str]]) -> float:
    """Share of questions with an answering document among their retrieved documents."""
    if not questions:
        return 0.0
    return sum(hit(q, docs) for q, docs in zip(questions, retrieved, strict=True)) / len(questions)


@click.command()
@click.option(
    "--events",
    "events_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Trace events JSONL (see the trace format in the data README).",
)
@click.option(
    "--questions",
    "questions_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Trace questions JSONL.",
)
@click.option("--tenant", default="default", show_default=True, help="Tenant to index under.")
@click.option(
    "--qdrant-path",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Local-mode store to fill (must be new); default a temporary one, removed afterwards.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def rag(
    events_path: Path, questions_path: Path, tenant: str, qdrant_path: Path | None, as_json: bool
) -> None:
    """Chunk count, ingest throughput, query latency, recall@3 and embedding reuse on a trace."""
    try:
        events = list(read_events(events_path))
        questions = read_questions(questions_path)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="ragwarm-bench-rag-") as tmp:
        result = run_bench(events, questions, qdrant_path or Path(tmp), tenant)
    if as_json:
        click.echo(json.dumps(asdict(result)))
    else:
        _print(result)


def run_bench(
    events: list[TraceEvent], questions: list[Question], path: Path, tenant: str
) -> RagBench:
    """Measure on a fresh local-mode store at `path`."""
    from rag.index import Indexer
    from rag.prompt import PromptBuilder
    from rag.retrieve import Retriever
    from rag.settings import QdrantSettings, RagSettings
    from rag.store import ChunkStore

    if path.exists() and any(path.iterdir()):
        raise click.ClickException(f"{path} is not empty; the benchmark needs a fresh store")
    settings = RagSettings()
    tokenizer, embedder = _models(settings)
    split = split_initial(events)
    out = RagBench()
    with ChunkStore.open(QdrantSettings(path=path), settings.collection, embedder.dim) as store:
        indexer = Indexer.from_settings(store, embedder, tokenizer, settings)
        retriever = Retriever(store, embedder, settings.top_k)
        started = time.perf_counter()
        indexer.index_documents([e.to_change(tenant) for e in split.initial])
        out.ingest_s = time.perf_counter() - started
        out.chunks = store.count(tenant)
        out.ingest_chunks_per_s = out.chunks / out.ingest_s if out.ingest_s else 0.0
        judged = judged_questions(questions, split.initial_seq)
        out.questions, out.recall_at_3, out.query_ms_p50 = _queries(retriever, judged, tenant)
        prompts = PromptBuilder(tokenizer, settings.system_prompt)
        out.prefix_tokens_p50 = _prefix_p50(retriever, prompts, judged, tenant)
        _replay(indexer, split.rest, tenant, out)
        out.chunks_final = store.count(tenant)
        last_seq = events[-1].seq if events else -1
        final = judged_questions(questions, last_seq)
        out.questions_final, out.recall_at_3_final, _ = _queries(retriever, final, tenant)
    return out


def _models(settings: RagSettings) -> tuple[Tokenizer, Embedder]:
    from ragwarm.models import ModelMissing, llm_dir, load_embedder, load_tokenizer

    try:
        tokenizer = load_tokenizer(llm_dir())
        embedder = load_embedder(
            batch_size=settings.embed_batch_size,
            precision=settings.embed_precision,
            threads=settings.embed_threads,
        )
    except ModelMissing as exc:
        raise click.ClickException(str(exc)) from None
    return tokenizer, embedder


def _queries(
    retriever: Retriever, questions: list[Question], tenant: str
) -> tuple[int, float, float]:
    """(questions, recall@3, p50 latency in ms); each question is timed on its own."""
    retrieved: list[list[str]] = []
    latencies: list[float] = []
    for question in questions:
        started = time.perf_counter()
        result = retriever.retrieve(question.question, tenant, 3)
        latencies.append((time.perf_counter() - started) * 1000)
        retrieved.append(result.doc_ids)
    p50 = statistics.median(latencies) if latencies else 0.0
    return len(questions), recall(questions, retrieved), p50


def _prefix_p50(
    retriever: Retriever, prompts: PromptBuilder, questions: list[Question], tenant: str
) -> float:
    """Median length of the warmable prefix (system prompt + top-3 chunks) in LLM tokens."""
    found = retriever.retrieve_many([q.question for q in questions], tenant)
    sizes = [len(prompts.build_prefix(r.chunks)) for r in found]
    return float(statistics.median(sizes)) if sizes else 0.0


def _replay(indexer: Indexer, events: list[TraceEvent], tenant: str, out: RagBench) -> None:
    from tqdm import tqdm

    started = time.perf_counter()
    bar = tqdm(events, desc="replay", unit="event", disable=not sys.stderr.isatty())
    for event in bar:
        result = indexer.index_document(event.to_change(tenant))
        out.embeddings_computed += result.embedded
        if result.applied and result.op == "upsert":
            out.embeddings_naive += len(result.chunks)
    out.replay_events = len(events)
    out.replay_s = time.perf_counter() - started


def _print(r: RagBench) -> None:
    saved = 1 - r.embeddings_computed / r.embeddings_naive if r.embeddings_naive else 0.0
    lines = [
        f"initial state: {r.chunks} chunks in {r.ingest_s:.1f} s "
        f"({r.ingest_chunks_per_s:.1f} chunks/s)",
        f"retrieval: {r.questions} questions, recall@3 {r.recall_at_3:.3f}, "
        f"p50 {r.query_ms_p50:.1f} ms, top-3 prefix p50 {r.prefix_tokens_p50:.0f} tokens",
        f"replay: {r.replay_events} events in {r.replay_s:.1f} s, "
        f"{r.embeddings_computed} embeddings computed vs {r.embeddings_naive} naive "
        f"({saved:.1%} saved)",
        f"final state: {r.chunks_final} chunks, recall@3 {r.recall_at_3_final:.3f} "
        f"over {r.questions_final} questions",
    ]
    click.echo("\n".join(lines))
