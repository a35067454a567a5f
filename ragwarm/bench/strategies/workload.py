"""The query workload and the one simulated clock it shares with a trace's KB changes (pure)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ragwarm.trace import Question, TraceEvent, split_initial


@dataclass(frozen=True)
class Arrival:
    """When a query arrives (simulated seconds) and whether it belongs to a burst."""

    at: float
    burst: bool = False


@dataclass(frozen=True)
class KbStep:
    at: float
    event: TraceEvent


@dataclass(frozen=True)
class QueryStep:
    at: float
    index: int
    question: Question
    burst: bool


Step = KbStep | QueryStep


def zipf_weights(qids: Sequence[str], s: float, rng: random.Random) -> dict[str, float]:
    """Popularity 1/rank^s over a seeded shuffle of the questions (rank 1 is the hottest)."""
    order = list(qids)
    rng.shuffle(order)
    return {qid: 1.0 / (rank**s) for rank, qid in enumerate(order, start=1)}


def arrivals(
    n: int,
    rng: random.Random,
    mean_gap_s: float,
    burst_prob: float,
    burst_size: tuple[int, int],
    burst_gap_s: float,
) -> list[Arrival]:
    """`n` arrival times: exponential gaps, and now and then a burst of closely spaced queries."""
    out: list[Arrival] = []
    now = 0.0
    while len(out) < n:
        now += rng.expovariate(1.0 / mean_gap_s)
        if rng.random() < burst_prob:
            size = rng.randint(*burst_size)
            for i in range(min(size, n - len(out))):
                if i:
                    now += rng.expovariate(1.0 / burst_gap_s)
                out.append(Arrival(now, burst=True))
        else:
            out.append(Arrival(now))
    return out


def split_trace(events: Sequence[TraceEvent]) -> tuple[list[TraceEvent], list[TraceEvent]]:
    """(initial state, changes to replay). Events marked `initial` form the initial state;
    in a trace without marks it is every event before the first one that touches a
    document a second time."""
    split = split_initial(events)
    if split.rest or not events:
        return split.initial, split.rest
    seen: set[str] = set()
    for i, event in enumerate(events):
        if event.doc_id in seen:
            return list(events[:i]), list(events[i:])
        seen.add(event.doc_id)
    return list(events), []


def kb_slice(
    initial: Sequence[TraceEvent], questions: Sequence[Question], limit: int | None,
    rng: random.Random,
) -> list[TraceEvent]:
    """The initial state cut to `limit` documents: every document a question names, then a
    seeded sample of the others as retrieval distractors (all of them when `limit` is None)."""
    if limit is None:
        return list(initial)
    named = set().union(*(q.answer_docs for q in questions)) if questions else set()
    keep = [e for e in initial if e.doc_id in named]
    others = [e for e in initial if e.doc_id not in named]
    sample = rng.sample(others, min(len(others), max(0, limit - len(keep))))
    return sorted(keep + sample, key=lambda e: e.seq)


def relevant_edits(
    events: Iterable[TraceEvent], docs: set[str], limit: int | None,
    initial: Sequence[TraceEvent] = (),
) -> list[TraceEvent]:
    """The changes to any of `docs` up to the `limit`-th that changes a document's content;
    a re-ingest of the same text rides along uncounted. Every change when `limit` is None."""
    if limit is None:
        return list(events)
    text = _texts(initial)
    picked: list[TraceEvent] = []
    counted = 0
    for event in events:
        if counted >= limit:
            break
        changed = _apply_text(text, event)
        if event.doc_id in docs:
            picked.append(event)
            counted += changed
    return picked


def content_changes(
    initial: Sequence[TraceEvent], events: Iterable[TraceEvent]
) -> list[TraceEvent]:
    """The events that change a document's text (an upsert of new text, or a delete)."""
    text = _texts(initial)
    return [e for e in events if _apply_text(text, e)]


def _texts(initial: Sequence[TraceEvent]) -> dict[str, str | None]:
    return {e.doc_id: e.text for e in initial if e.op == "upsert"}


def _apply_text(text: dict[str, str | None], event: TraceEvent) -> bool:
    """Apply `event` to the doc -> text map; whether it changed the document's content."""
    before = text.get(event.doc_id)
    after = event.text if event.op == "upsert" else None
    if after is None:
        text.pop(event.doc_id, None)
    else:
        text[event.doc_id] = after
    return after != before


def sample_questions(
    questions: Sequence[Question], edited: set[str], n: int, doc_limit: int,
    rng: random.Random,
) -> list[Question]:
    """A seeded sample of `n` questions whose named documents stay within `doc_limit`.

    Half of it (at most) first among questions about an `edited` document, so a short run
    still sees edits to what it asks; the rest among all. A question that would take the
    named documents past `doc_limit` is passed over (the KB slice indexes only these).
    """
    about_edits = [q for q in questions if q.answer_docs & edited]
    others = [q for q in questions if not q.answer_docs & edited]
    rng.shuffle(about_edits)
    rng.shuffle(others)
    first = about_edits[: (n + 1) // 2]
    rest = about_edits[len(first):] + others
    rng.shuffle(rest)
    picked: list[Question] = []
    docs: set[str] = set()
    for question in first + rest:
        if len(picked) >= n:
            break
        if len(docs | question.answer_docs) <= doc_limit:
            picked.append(question)
            docs |= question.answer_docs
    return picked


def edit_times(events: Sequence[TraceEvent], start: float, end: float) -> list[float]:
    """Spread changes over [start, end] by commit: one slot per distinct timestamp, evenly.

    A commit that touches several documents keeps its changes together (one burst of KB
    events), and the long quiet gaps of a real history do not leave the run without edits.
    """
    stamps = list(dict.fromkeys(e.timestamp for e in events))
    if not stamps:
        return []
    step = (end - start) / len(stamps)
    slot = {stamp: start + step * (i + 0.5) for i, stamp in enumerate(stamps)}
    return [slot[e.timestamp] for e in events]


def timeline(
    arrivals_: Sequence[Arrival],
    edits: Sequence[TraceEvent],
    questions: Sequence[Question],
    weights: dict[str, float],
    initial_seq: int,
    rng: random.Random,
    edits_from: float = 0.25,
    deps: Mapping[str, frozenset[str]] | None = None,
    *,
    post_edit_asks: bool = True,
) -> list[Step]:
    """Queries and KB changes in time order, each query drawn among the questions live then.

    Changes occupy [edits_from, 0.95] of the run. A question is asked only while it exists
    (`first_seq` / `removed_seq` against the last change applied before the query). With
    `post_edit_asks` (the named scenario) questions are moved so every edit is followed by
    an ask it concerns (`ask_after_edits`); without, the drawn timeline as it is.
    """
    duration = arrivals_[-1].at if arrivals_ else 0.0
    times = edit_times(edits, duration * edits_from, duration * 0.95)
    kb = [KbStep(t, e) for t, e in zip(times, edits, strict=True)]
    steps: list[Step] = []
    seq, k = initial_seq, 0
    for index, arrival in enumerate(arrivals_):
        while k < len(kb) and kb[k].at <= arrival.at:
            steps.append(kb[k])
            seq = max(seq, kb[k].event.seq)
            k += 1
        question = draw(questions, weights, seq, rng)
        if question is not None:
            steps.append(QueryStep(arrival.at, index, question, arrival.burst))
    steps.extend(kb[k:])
    if not post_edit_asks:
        return steps
    return ask_after_edits(steps, questions, weights, initial_seq, rng, deps)


def ask_after_edits(
    steps: Sequence[Step], questions: Sequence[Question], weights: dict[str, float],
    initial_seq: int, rng: random.Random, deps: Mapping[str, frozenset[str]] | None = None,
) -> list[Step]:
    """The timeline with post-edit asks guaranteed: a question asked before an edit to one
    of its documents is asked again after it (before that document's next edit when there
    is room), a popularity-drawn number of queries later (a popular one soon, a rare one
    later). An edited document nobody asked about first gets its most popular question
    asked shortly before the edit. Only query steps' questions change; time, arrivals and
    edits stay, and it is the same timeline for every policy. A question depends on the
    documents of `deps[qid]` (what it retrieved at the start), else on its answer docs."""
    dep = {q.qid: (deps or {}).get(q.qid, frozenset()) | q.answer_docs for q in questions}
    out = list(steps)
    seqs = _seq_before(out, initial_seq)
    kept: set[int] = set()  # query positions that carry a guarantee: never replaced
    for i, step in enumerate(out):
        if not isinstance(step, KbStep):
            continue
        doc = step.event.doc_id
        asked = _asked_before(out, i, doc, dep, kept)
        if not asked:
            about = [q for q in questions if doc in dep[q.qid]]
            placed = _place(out, range(i - 1, -1, -1), about, weights, seqs, kept, rng)
            asked = [placed] if placed else []
        end = _next_edit(out, i, doc)
        for question in asked:
            again = _next_ask(out, i, question.qid)
            if again is not None:
                kept.add(again)
            elif not _place(out, range(i + 1, end), [question], weights, seqs, kept, rng):
                _place(out, range(end, len(out)), [question], weights, seqs, kept, rng)
    return out


def _next_edit(steps: Sequence[Step], i: int, doc: str) -> int:
    """The position of `doc`'s next edit after step `i` (the end when there is none)."""
    for j in range(i + 1, len(steps)):
        step = steps[j]
        if isinstance(step, KbStep) and step.event.doc_id == doc:
            return j
    return len(steps)


def _next_ask(steps: Sequence[Step], i: int, qid: str) -> int | None:
    for j in range(i + 1, len(steps)):
        step = steps[j]
        if isinstance(step, QueryStep) and step.question.qid == qid:
            return j
    return None


def _seq_before(steps: Sequence[Step], initial_seq: int) -> list[int]:
    """The trace position (last change applied) at each step."""
    seqs, seq = [], initial_seq
    for step in steps:
        seqs.append(seq)
        if isinstance(step, KbStep):
            seq = max(seq, step.event.seq)
    return seqs


def _asked_before(
    steps: Sequence[Step], i: int, doc: str, dep: Mapping[str, frozenset[str]], kept: set[int]
) -> list[Question]:
    """The questions about `doc` asked before step `i`; their last asks are kept."""
    last: dict[str, int] = {}
    for j, step in enumerate(steps[:i]):
        if isinstance(step, QueryStep) and doc in dep.get(step.question.qid, ()):
            last[step.question.qid] = j
    kept.update(last.values())
    return [steps[j].question for j in last.values()]  # type: ignore[union-attr]


def _place(
    steps: list[Step], positions: Iterable[int], candidates: Sequence[Question],
    weights: dict[str, float], seqs: Sequence[int], kept: set[int], rng: random.Random,
) -> Question | None:
    """Ask the most popular candidate at a free query position of `positions` (in order),
    skipping a popularity-drawn number of them first; None when none is free and live."""
    if not candidates:
        return None
    question = max(candidates, key=lambda q: weights.get(q.qid, 0.0))
    free = [j for j in positions if isinstance(steps[j], QueryStep) and j not in kept
            and question.live_at(seqs[j])]
    if not free:
        return None
    chance = weights.get(question.qid, 0.0) / (sum(weights.values()) or 1.0)
    skip = int(rng.expovariate(chance)) if chance > 0 else len(free)
    # Never in the last half of what is free: later edits need room for their asks too.
    j = free[min(skip, (len(free) - 1) // 2)]
    old = steps[j]
    assert isinstance(old, QueryStep)
    steps[j] = QueryStep(old.at, old.index, question, old.burst)
    kept.add(j)
    return question


def draw(
    questions: Sequence[Question], weights: dict[str, float], seq: int, rng: random.Random
) -> Question | None:
    """One question by popularity among those live at `seq` (None when none is)."""
    live = [q for q in questions if q.live_at(seq)]
    if not live:
        return None
    return rng.choices(live, weights=[weights[q.qid] for q in live], k=1)[0]


def past_log(
    questions: Sequence[Question],
    weights: dict[str, float],
    seq: int,
    n: int,
    rng: random.Random,
) -> list[Question]:
    """Yesterday's traffic for history-based policies: `n` draws like today's, at `seq`."""
    drawn = (draw(questions, weights, seq, rng) for _ in range(n))
    return [q for q in drawn if q is not None]


def by_popularity(log: Sequence[Question]) -> list[Question]:
    """Distinct questions of a log, most asked first (ties: first asked first)."""
    counts: dict[str, int] = {}
    first: dict[str, Question] = {}
    for q in log:
        counts[q.qid] = counts.get(q.qid, 0) + 1
        first.setdefault(q.qid, q)
    return sorted(first.values(), key=lambda q: -counts[q.qid])
