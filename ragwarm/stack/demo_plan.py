"""The demo's pure parts: which edits and questions, per-question results, table and chart."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rag.trace import Question, TraceEvent, split_initial

PHASES = ("cold", "warm", "after_edit")


# --- the plan: which edits, which questions (pure) --------------------------------------------
@dataclass(frozen=True)
class DemoPlan:
    initial: list[TraceEvent]
    edits: list[TraceEvent]
    questions: list[Question]  # candidates, round-robin over the edited documents


def plan_demo(events: Sequence[TraceEvent], questions: Sequence[Question],
              n_edits: int) -> DemoPlan:
    """The initial state, the first `n_edits` edits of documents that answer a question live
    in that state, and those questions, alternating between the edited documents."""
    split = split_initial(events)
    live = [q for q in questions if q.live_at(split.initial_seq) and q.answer_docs]
    answered = {d for q in live for d in q.answer_docs}
    edits = [e for e in split.rest if e.doc_id in answered][:n_edits]
    by_doc: dict[str, list[Question]] = {}
    for edit in edits:
        by_doc.setdefault(edit.doc_id, [q for q in live if edit.doc_id in q.answer_docs])
    return DemoPlan(split.initial, edits, round_robin(list(by_doc.values())))


def changed_chunks(initial: Sequence[TraceEvent], edits: Sequence[TraceEvent],
                   chunker: Callable[[str, str], dict[str, str]]) -> set[str]:
    """Ids of the chunks (as of the initial state or a later edit) that an edit of the slice
    changes or removes: the prefixes built from them get invalidated, the rest extended.
    `chunker(doc_id, text)` returns chunk_id -> content hash, as the indexer chunks."""
    texts = {e.doc_id: e.text or "" for e in initial if e.op == "upsert"}
    changed: set[str] = set()
    for edit in edits:
        before = chunker(edit.doc_id, texts.get(edit.doc_id, ""))
        after = chunker(edit.doc_id, edit.text or "") if edit.op == "upsert" else {}
        changed |= {c for c, h in before.items() if after.get(c) != h}
        texts[edit.doc_id] = edit.text or ""
    return changed


def round_robin(groups: list[list[Question]]) -> list[Question]:
    out: list[Question] = []
    seen: set[str] = set()
    for i in range(max((len(g) for g in groups), default=0)):
        for group in groups:
            if i < len(group) and group[i].qid not in seen:
                seen.add(group[i].qid)
                out.append(group[i])
    return out


# --- results (pure) ------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One asked question."""

    question: str
    phase: str
    ttft_ms: float
    cached_tokens: int
    prompt_tokens: int
    worker_ttft_ms: float | None
    t_s: float
    prefix_hash: str | None
    prefix_tokens: int
    worker_id: str


@dataclass(frozen=True)
class Summary:
    """One question across the phases (medians where it was asked more than once)."""

    question: str
    ttft: dict[str, float]
    cached: dict[str, int]
    after_edit: str  # what became of the question's prefix after the edits

    @property
    def ratio(self) -> float | None:
        """After-edit TTFT over warm TTFT: about 1 when the edit was re-warmed."""
        if "warm" not in self.ttft or "after_edit" not in self.ttft:
            return None
        return self.ttft["after_edit"] / self.ttft["warm"]


def summarize(rows: Sequence[Row]) -> list[Summary]:
    out = []
    for question in dict.fromkeys(r.question for r in rows):
        mine = [r for r in rows if r.question == question]
        ttft, cached = {}, {}
        for phase in PHASES:
            at = [r for r in mine if r.phase == phase]
            if at:
                ttft[phase] = statistics.median(r.ttft_ms for r in at)
                cached[phase] = int(statistics.median(r.cached_tokens for r in at))
        out.append(Summary(question, ttft, cached, after_edit_state(mine)))
    return out


def after_edit_state(rows: Sequence[Row], block_size: int = 16) -> str:
    before = [r for r in rows if r.phase == "warm"]
    after = [r for r in rows if r.phase == "after_edit"]
    if not before or not after:
        return "-"
    last = after[-1]
    if last.prefix_hash == before[-1].prefix_hash:
        return "unchanged (TTL extended)"
    if last.cached_tokens >= last.prefix_tokens // block_size * block_size:
        return "changed, re-warmed"
    return "changed, NOT re-warmed"


def table_lines(summaries: Sequence[Summary]) -> list[str]:
    head = (f"{'question':<46} {'cold ms':>9} {'warm ms':>9} {'after-edit ms':>14} "
            f"{'x warm':>7}  {'cached cold/warm/after':>22}  prefix after edit")
    lines = [head, "-" * len(head)]
    for s in summaries:
        cells = [f"{s.ttft[p]:.1f}" if p in s.ttft else "-" for p in PHASES]
        cached = "/".join(str(s.cached.get(p, "-")) for p in PHASES)
        ratio = f"{s.ratio:.2f}" if s.ratio is not None else "-"
        q = s.question if len(s.question) <= 46 else s.question[:45] + "…"
        lines.append(f"{q:<46} {cells[0]:>9} {cells[1]:>9} {cells[2]:>14} {ratio:>7}  "
                     f"{cached:>22}  {s.after_edit}")
    return lines


def write_chart(rows: Sequence[Row], edit_at_s: float | None, path: Path) -> Path:
    """TTFT of every query over time, by phase, with the moment the edits were applied."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(9, 4.8))
    ax = fig.add_subplot()
    colors = {"cold": "tab:red", "warm": "tab:green", "after_edit": "tab:blue"}
    for phase in PHASES:
        at = [r for r in rows if r.phase == phase]
        if at:
            ax.scatter([r.t_s for r in at], [r.ttft_ms for r in at], color=colors[phase],
                       label=phase.replace("_", " "), zorder=3)
    if edit_at_s is not None:
        ax.axvline(edit_at_s, color="gray", linestyle="--")
        ax.annotate("KB edits applied", (edit_at_s, 0.97), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", color="gray")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    # Label only the 2s and 5s between powers of ten, so the axis stays readable.
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda value, _: f"{value:g}" if f"{value:g}"[0] in "25" else ""))
    ax.set_xlabel("seconds since the first query")
    ax.set_ylabel("time to first token (ms, client-side)")
    ax.set_title("ragwarm demo: TTFT cold, warm, and after real KB edits")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
