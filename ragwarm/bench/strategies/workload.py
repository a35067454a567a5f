"""The query workload and the one simulated clock it shares with a trace's KB changes (pure)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rag.trace import Question, TraceEvent, split_initial


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
    events: Iterable[TraceEvent], docs: set[str], limit: int | None
) -> list[TraceEvent]:
    """The first `limit` changes to any of `docs` (all changes when `limit` is None)."""
    if limit is None:
        return list(events)
    picked: list[TraceEvent] = []
    for event in events:
        if len(picked) >= limit:
            break
        if event.doc_id in docs:
            picked.append(event)
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
) -> list[Step]:
    """Queries and KB changes in time order, each query drawn among the questions live then.

    Changes occupy [edits_from, 0.95] of the run. A question is asked only while it exists
    (`first_seq` / `removed_seq` against the last change applied before the query).
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
    return steps


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
