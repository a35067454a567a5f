"""The demo's pure parts: which edits and questions, per-question results, table and chart."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragwarm.trace import Question, TraceEvent, split_initial
from schemas.prefix import warm_hit

# Before the edits a row's phase is what the cache held when it was asked (not the order of
# asking: a question's second ask may already be warm); after them it is `after_edit`.
PHASES = ("cold", "partial", "warm", "after_edit")
REWARMED = "changed, re-warmed"


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
    # The same prompt, same moment, on a worker with plain prefix caching (the `reactive`
    # policy: it caches what it answered, nothing warms or invalidates it).
    reactive_ttft_ms: float | None = None
    reactive_cached: int | None = None


def held(cached_tokens: int, prefix_tokens: int, block_size: int = 16) -> str:
    """What the cache held for an answer: nothing, part of the prefix, or all its full blocks."""
    if cached_tokens <= 0:
        return "cold"
    if warm_hit(cached_tokens, prefix_tokens, block_size):
        return "warm"
    return "partial"


@dataclass(frozen=True)
class Summary:
    """One question across the phases (medians where it was asked more than once)."""

    question: str
    ttft: dict[str, float]
    cached: dict[str, int]
    after_edit: str  # what became of the question's prefix after the edits
    first_after: Row | None = None  # the first ask after the edits: what the edit cost

    @property
    def ratio(self) -> float | None:
        """First after-edit TTFT over warm TTFT: about 1 when the edit was re-warmed."""
        if "warm" not in self.ttft or self.first_after is None:
            return None
        return self.first_after.ttft_ms / self.ttft["warm"]

    @property
    def reactive_ratio(self) -> float | None:
        """The same for plain prefix caching, measured on the baseline worker."""
        row = self.first_after
        if "warm" not in self.ttft or row is None or row.reactive_ttft_ms is None:
            return None
        return row.reactive_ttft_ms / self.ttft["warm"]


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
        first = next((r for r in mine if r.phase == "after_edit"), None)
        out.append(Summary(question, ttft, cached, after_edit_state(mine), first))
    return out


def rewarm_targets(before: Mapping[str, str | None],
                   now: Mapping[str, str | None]) -> set[str]:
    """The new prefixes the demo waits for after the edits: every question whose prefix
    changed. Its question is hot (pinned before the edits), so the pipeline re-warms it
    whether the edit invalidated the old prefix or only extended it (a re-check). Which of
    the two the table shows at one poll says nothing: with edits to two documents the second
    invalidation may not be applied yet, and a question left out was asked before its
    re-prefill landed (only the system prompt cached)."""
    return {p for q, p in now.items() if p and p != before.get(q)}


def after_edit_state(rows: Sequence[Row], block_size: int = 16) -> str:
    """What the edits did to a question's prefix, and whether its first ask after them found
    every full block of the new prefix cached (later asks find the prompt its own answer
    cached, so they say nothing about the pipeline)."""
    before = [r for r in rows if r.phase != "after_edit"]
    after = [r for r in rows if r.phase == "after_edit"]
    if not before or not after:
        return "-"
    first = after[0]
    if first.prefix_hash == before[-1].prefix_hash:
        return "unchanged (TTL extended)"
    if held(first.cached_tokens, first.prefix_tokens, block_size) == "warm":
        return REWARMED
    return "changed, NOT re-warmed"


def rewarm_verdict(summaries: Sequence[Summary]) -> str | None:
    """Whether every prefix the edits changed was warm again at its question's first ask,
    judged on what that ask found cached. Not on its TTFT beside a warm ask's: a warm ask
    found its whole prompt cached, question included, which no warmup of a prefix holds
    for a prompt never asked (its last partial block and the question are computed)."""
    changed = [s for s in summaries if s.after_edit.startswith("changed")]
    if not changed:
        return None
    ok = sum(s.after_edit == REWARMED for s in changed)
    word = "all re-warmed" if ok == len(changed) else "NOT all re-warmed"
    return (f"edited prefixes warm at their first ask: {ok} of {len(changed)} ({word}: every "
            "full block of the new prefix cached)")


def table_lines(summaries: Sequence[Summary]) -> list[str]:
    """Medians before the edits by what the cache held; after them, the first ask on ragwarm's
    worker beside the same prompt on the plain-prefix-caching worker."""
    head = (f"{'question':<40} {'cold ms':>8} {'partial':>8} {'warm ms':>8} │ "
            f"{'1st after edit: ragwarm':>24} {'plain caching':>20} │ prefix after edit")
    lines = [head, "-" * len(head)]
    for s in summaries:
        cells = [f"{s.ttft[p]:.1f}" if p in s.ttft else "-" for p in PHASES[:3]]
        first = s.first_after
        ours = f"{first.ttft_ms:.1f} ({first.cached_tokens}/{first.prompt_tokens})" if first \
            else "-"
        plain = "-"
        if first is not None and first.reactive_ttft_ms is not None:
            plain = f"{first.reactive_ttft_ms:.1f} ({first.reactive_cached}/{first.prompt_tokens})"
        q = s.question if len(s.question) <= 40 else s.question[:39] + "…"
        lines.append(f"{q:<40} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8} │ {ours:>24} "
                     f"{plain:>20} │ {s.after_edit}")
    lines.append("(ms: client-side TTFT; in brackets: cached/prompt tokens)")
    return lines


def write_chart(rows: Sequence[Row], edit_at_s: float | None, path: Path) -> Path:
    """TTFT of every query over time, by phase, with the moment the edits were applied."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(9, 4.8))
    ax = fig.add_subplot()
    colors = {"cold": "tab:red", "partial": "tab:orange", "warm": "tab:green",
              "after_edit": "tab:blue"}
    for phase in PHASES:
        at = [r for r in rows if r.phase == phase]
        if at:
            ax.scatter([r.t_s for r in at], [r.ttft_ms for r in at], color=colors[phase],
                       label=phase.replace("_", " "), zorder=3)
    plain = [(r.t_s, r.reactive_ttft_ms) for r in rows
             if r.phase == "after_edit" and r.reactive_ttft_ms is not None]
    if plain:
        ax.scatter([t for t, _ in plain], [ms for _, ms in plain], marker="x",
                   color="tab:gray", label="after edit, plain prefix caching", zorder=3)
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
