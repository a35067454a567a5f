"""`ragwarm bench blend`: chunk-reuse assembly against full prefill on real questions' prompts."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ragwarm.bench.engine import DEFAULT_EVENTS

if TYPE_CHECKING:
    import torch

    from rag.retrieve import Retrieval
    from workers.engines.blend import KV, Piece, Selection

DEFAULT_QUESTIONS = DEFAULT_EVENTS.with_name("questions.jsonl")
DEFAULT_SHARES = "0,0.05,0.1,0.15,0.25"
GREEDY_TOKENS = 16


@dataclass(frozen=True)
class Case:
    """One question's canonical prompt, cut where its chunks start and end."""

    qid: str
    token_ids: list[int]
    opening: int
    chunks: list[tuple[str, list[int]]]  # (chunk key, token ids) in prompt order
    # Per chunk, the token ids of the chunk before it in its document ([] for a first one).
    bridges: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    """Full prefill vs blend on one prompt at one share."""

    same_first: bool
    same_greedy: bool
    kl: float
    full_s: float
    blend_s: float
    recomputed: int


@dataclass
class Runner:
    """The model, the system prompt's KV and every chunk's KV computed on its own (once).

    `bridge` > 0: a chunk is computed after the system prompt and the last `bridge` tokens of
    the chunk before it in its document (its KV alone is kept), so its tokens have attended
    to text like what precedes them in a prompt; retrieved chunks are often neighbours, and
    the canonical order puts them in document order. A chunk has one KV, bridged or not.
    """

    model: Any
    opening_kv: KV
    opening_ids: list[int]
    bridge: int = 0
    chunk_kv: dict[str, tuple[KV, int]] = field(default_factory=dict)

    def pieces(self, case: Case) -> list[Piece]:
        from workers.engines.blend import Piece

        out, start = [], case.opening
        bridges = case.bridges or [[] for _ in case.chunks]
        for (key, ids), before in zip(case.chunks, bridges, strict=True):
            tail = before[-self.bridge :] if self.bridge else []
            if key not in self.chunk_kv:
                self.chunk_kv[key] = self._compute(ids, tail)
            kv, at = self.chunk_kv[key]
            # After exactly what precedes it here (the opening, then its bridge whole)?
            context = case.token_ids[case.opening : start]
            out.append(Piece(start, kv, at, in_context=at == start and context == tail))
            start += len(ids)
        return out

    def _compute(self, ids: list[int], bridge: list[int]) -> tuple[KV, int]:
        """The chunk's KV after the system prompt and `bridge`, and its first position."""
        import torch

        from workers.engines.blend import prefill

        past = self.opening_kv
        if bridge:
            bridge_kv, _ = prefill(self.model, bridge, past)
            past = tuple((torch.cat((k, bk), -2), torch.cat((v, bv), -2))
                         for (k, v), (bk, bv) in zip(past, bridge_kv, strict=True))
        kv, _ = prefill(self.model, ids, past)
        return kv, len(self.opening_ids) + len(bridge)


# -- measuring -----------------------------------------------------------------------------


def greedy(model: Any, kv: KV, logits: torch.Tensor, n: int) -> list[int]:
    """The first `n` greedy tokens after a prompt whose KV and last logits are given."""
    import torch

    from workers.engines.blend import as_cache

    cache, out = as_cache(model, kv), [int(torch.argmax(logits))]
    with torch.inference_mode():
        while len(out) < n:
            ids = torch.tensor([[out[-1]]], device=logits.device)
            step = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            out.append(int(torch.argmax(step.logits[0, -1])))
    return out


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p ‖ q) of the two next-token distributions, in nats."""
    p = p_logits.double().log_softmax(-1)
    q = q_logits.double().log_softmax(-1)
    return max(0.0, float((p.exp() * (p - q)).sum()))


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def full_run(model: Any, case: Case) -> tuple[torch.Tensor, list[int], float]:
    """(first-token logits, greedy tokens, TTFT) of a cold prefill of the whole prompt."""
    import torch

    from workers.engines.blend import prefill

    def first() -> tuple[Any, torch.Tensor, int]:
        kv, logits = prefill(model, case.token_ids)
        return kv, logits, int(torch.argmax(logits))

    (kv, logits, _), ttft = _timed(first)
    return logits, greedy(model, kv, logits, GREEDY_TOKENS), ttft


def blend_run(
    runner: Runner, case: Case, selection: Selection, full: tuple[torch.Tensor, list[int], float]
) -> Outcome:
    """One blended prefill (chunk KV warm, not timed) compared with the full one."""
    import torch

    from workers.engines.blend import blend

    pieces = runner.pieces(case)

    def first() -> Any:
        result = blend(runner.model, case.token_ids, runner.opening_kv, pieces, selection)
        int(torch.argmax(result.logits))
        return result

    result, ttft = _timed(first)
    tokens = greedy(runner.model, result.kv, result.logits, GREEDY_TOKENS)
    full_logits, full_tokens, full_s = full
    return Outcome(
        same_first=tokens[0] == full_tokens[0],
        same_greedy=tokens == full_tokens,
        kl=kl_divergence(full_logits, result.logits),
        full_s=full_s,
        blend_s=ttft,
        recomputed=result.recomputed,
    )


def summarize(share: float, outcomes: Sequence[Outcome]) -> dict[str, float]:
    n = len(outcomes) or 1
    return {
        "recompute_share": share,
        "first_token_agreement": round(sum(o.same_first for o in outcomes) / n, 4),
        "greedy16_exact": round(sum(o.same_greedy for o in outcomes) / n, 4),
        "mean_kl_first_token": round(sum(o.kl for o in outcomes) / n, 6),
        "ttft_full_ms_p50": _p50_ms([o.full_s for o in outcomes]),
        "ttft_blend_ms_p50": _p50_ms([o.blend_s for o in outcomes]),
        "recomputed_tokens_mean": round(sum(o.recomputed for o in outcomes) / n, 1),
    }


def _brief(per_share: dict[float, list[Outcome]]) -> str:
    """Running figures per share: first-token and greedy agreement, mean KL, TTFT ratio."""
    parts = []
    for share, outcomes in per_share.items():
        r = summarize(share, outcomes)
        ratio = r["ttft_blend_ms_p50"] / r["ttft_full_ms_p50"] if r["ttft_full_ms_p50"] else 0
        parts.append(f"{share}: {r['first_token_agreement']:.2f}/{r['greedy16_exact']:.2f}/"
                     f"{r['mean_kl_first_token']:.4f}/{ratio:.0%}")
    return ", ".join(parts)


def _p50_ms(seconds: Sequence[float]) -> float:
    return round(statistics.median(seconds) * 1000, 1) if seconds else 0.0


# -- the prompts ---------------------------------------------------------------------------


def make_case(
    builder: Any, qid: str, question: str, retrieval: Retrieval,
    before: dict[str, str] | None = None,
) -> Case:
    """The canonical prompt of a question, with the token span of each chunk (and the
    tokens of the chunk before each in its document: `before`, chunk id to its block)."""
    from rag.prompt import canonical_order

    prompt = builder.build(retrieval.chunks, question)
    parts = builder.prefix_parts(retrieval.chunks)
    encode = builder.tokenizer.encode
    ids = [list(encode(part, add_special_tokens=False)) for part in parts]
    if [t for p in ids for t in p] != list(prompt.prefix_ids):
        raise click.ClickException("the prompt's parts do not tokenize to its prefix")
    ordered = canonical_order(retrieval.chunks)
    keys = [f"{c.chunk_id}@{c.content_hash}" for c in ordered]
    bridges = [list(encode((before or {}).get(c.chunk_id, ""), add_special_tokens=False))
               for c in ordered]
    return Case(qid, list(prompt.token_ids), len(ids[0]),
                list(zip(keys, ids[1:-1], strict=True)), bridges)


def blocks_before(store: Any, retrievals: Sequence[Retrieval]) -> dict[str, str]:
    """Per retrieved chunk id, the prompt block of the chunk before it in its document."""
    from rag.chunking import chunk_id, split_chunk_id
    from rag.prompt import chunk_block

    wanted = {}
    for retrieval in retrievals:
        for c in retrieval.chunks:
            doc, ordinal = split_chunk_id(c.chunk_id)
            if ordinal > 0:
                wanted[chunk_id(doc, ordinal - 1)] = c.chunk_id
    found = store.get_chunks(sorted(wanted), "bench")
    return {wanted[i]: chunk_block(s.chunk) for i, s in found.items()}


def retrieve_cases(
    events_path: Path, questions_path: Path, limit: int | None, tokenizer: Any
) -> list[Case]:
    """Index the documents the questions name (initial state) and build their prompts."""
    from rag.index import Indexer
    from rag.prompt import PromptBuilder
    from rag.retrieve import Retriever
    from rag.settings import QdrantSettings, RagSettings
    from rag.store import ChunkStore
    from ragwarm.bench.rag import judged_questions
    from ragwarm.bench.strategies.workload import split_trace
    from ragwarm.models import load_embedder
    from ragwarm.trace import TraceError, read_events, read_questions

    try:
        initial, _ = split_trace(list(read_events(events_path)))
        asked = read_questions(questions_path)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    seq = initial[-1].seq if initial else -1
    questions = (judged_questions(asked, seq) or [q for q in asked if q.live_at(seq)])[:limit]
    named = set().union(*(q.answer_docs for q in questions)) if questions else set()
    docs = [e for e in initial if e.doc_id in named] or list(initial)
    settings = RagSettings()
    embedder = load_embedder(
        batch_size=settings.embed_batch_size, precision=settings.embed_precision,
        threads=settings.embed_threads,
    )
    _progress(f"indexing {len(docs)} documents for {len(questions)} questions")
    with tempfile.TemporaryDirectory(prefix="ragwarm-bench-blend-") as tmp, ChunkStore.open(
        QdrantSettings(path=Path(tmp)), settings.collection, embedder.dim
    ) as store:
        Indexer.from_settings(store, embedder, tokenizer, settings).index_documents(
            [e.to_change("bench") for e in docs]
        )
        found = Retriever(store, embedder, settings.top_k).retrieve_many(
            [q.question for q in questions], "bench"
        )
        before = blocks_before(store, found)
    builder = PromptBuilder(tokenizer, settings.system_prompt)
    return [make_case(builder, q.qid, q.question, r, before)
            for q, r in zip(questions, found, strict=True) if r.chunks]


# -- the command ---------------------------------------------------------------------------


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _shares(text: str) -> list[float]:
    try:
        shares = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"not a list of numbers: {text!r}") from None
    if not shares or any(not 0.0 <= s <= 1.0 for s in shares):
        raise click.BadParameter("shares must lie within [0, 1]")
    return shares


def measure(
    runner: Runner, cases: Sequence[Case], shares: Sequence[float], method: str,
    checks: tuple[int, ...], widen: float,
) -> list[dict[str, float]]:
    """Per share, the summary over every case; runs interleave so noise hits both sides."""
    from workers.engines.blend import Selection

    per_share: dict[float, list[Outcome]] = {s: [] for s in shares}
    for i, case in enumerate(cases, 1):
        full = full_run(runner.model, case)
        for share in shares:
            selection = Selection(method=method, share=share, checks=checks, widen=widen)
            per_share[share].append(blend_run(runner, case, selection, full))
        _progress(f"[{i}/{len(cases)}] {case.qid}: {len(case.token_ids)} tokens, full "
                  f"{full[2] * 1000:.0f} ms; so far " + _brief(per_share))
    return [summarize(s, per_share[s]) for s in shares]


def draw_curve(report: dict[str, Any], path: Path) -> None:
    """Quality (left axis) and TTFT blend/full (right axis) against the recompute share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    shares = [r["recompute_share"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label in (("first_token_agreement", "first-token agreement"),
                       ("greedy16_exact", "16 greedy tokens identical")):
        ax.plot(shares, [r[key] for r in rows], marker="o", label=label)
    ratio = [r["ttft_blend_ms_p50"] / r["ttft_full_ms_p50"] for r in rows]
    ax.plot(shares, ratio, marker="^", linestyle=":", label="TTFT blend / full (p50)")
    ax.set(xlabel="recompute share of moved chunk tokens", ylim=(-0.02, 1.02),
           ylabel="share of questions / TTFT ratio",
           title=f"Chunk-KV blending vs full prefill ({report['questions']} questions, "
           f"{report['method']})")
    # KL spans decades: its own log axis, so the small values stay readable.
    kl_axis = ax.twinx()
    kl_axis.plot(shares, [r["mean_kl_first_token"] for r in rows], marker="s", color="black",
                 linestyle="--", label="mean KL, first token (right, log)")
    kl_axis.set(yscale="log", ylabel="mean KL (nats)")
    handles = ax.get_legend_handles_labels()[0] + kl_axis.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="center right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['questions']} questions, method {report['method']}, prompts of "
        f"{report['prompt_tokens_p50']:.0f} tokens (p50)",
        f"{'share':>6} {'first tok':>9} {'greedy16':>8} {'mean KL':>9} {'full ms':>8} "
        f"{'blend ms':>8} {'ratio':>6}",
    ]
    for r in report["results"]:
        ratio = r["ttft_blend_ms_p50"] / r["ttft_full_ms_p50"] if r["ttft_full_ms_p50"] else 0.0
        lines.append(
            f"{r['recompute_share']:>6.2f} {r['first_token_agreement']:>9.3f} "
            f"{r['greedy16_exact']:>8.3f} {r['mean_kl_first_token']:>9.5f} "
            f"{r['ttft_full_ms_p50']:>8.1f} {r['ttft_blend_ms_p50']:>8.1f} {ratio:>6.1%}"
        )
    return "\n".join(lines)

