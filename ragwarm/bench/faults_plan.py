"""`bench faults`, the pure parts: which slice of the trace, where each fault falls, the
oracle of the final state computed from the trace alone, and the accounting against it."""

from __future__ import annotations

import random
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragwarm.trace import Question, TraceEvent, split_initial

# Fault kinds, in the JSON's `faults` object. A host move is one of the streams kills: that
# restart gets a fresh RAGWARM_HOME (empty disk, same app id).
STREAMS_KILL = "streams_kills"
WORKER_KILL = "worker_kills"
BROKER_RESTART = "broker_restarts"
STORE_OUTAGE = "store_outages"
HOST_MOVE = "host_moves"
KINDS = (STREAMS_KILL, WORKER_KILL, BROKER_RESTART, STORE_OUTAGE, HOST_MOVE)

Chunker = Callable[[str, str], dict[str, str]]  # (doc_id, text) -> chunk_id -> content hash


# --- the slice of the trace ------------------------------------------------------------------
@dataclass(frozen=True)
class Slice:
    """The initial documents produced before the replay, the edits replayed under faults
    and the questions of the query load (live at the initial state, answered by a document
    of the slice)."""

    initial: list[TraceEvent]
    edits: list[TraceEvent]
    questions: list[Question]


def pick_slice(events: Sequence[TraceEvent], questions: Sequence[Question], docs: int,
               edits: int, max_bytes: int) -> Slice:
    """`docs` documents of the initial state (0: all), preferring those that answer a live
    question, then those edited first; the first `edits` edits of them; events whose text
    exceeds `max_bytes` are left out (a producer would refuse them)."""
    split = split_initial(e for e in events if _fits(e, max_bytes))
    live = [q for q in questions if q.live_at(split.initial_seq)]
    initial_docs = [e.doc_id for e in split.initial]
    ranked = [d for q in live for d in sorted(q.answer_docs) if d in set(initial_docs)]
    ranked += [e.doc_id for e in split.rest] + initial_docs
    chosen = set(dict.fromkeys(ranked)) if docs <= 0 else set(list(dict.fromkeys(ranked))[:docs])
    initial = [e for e in split.initial if e.doc_id in chosen]
    replay = [e for e in split.rest if e.doc_id in chosen][:edits]
    asked = [q for q in live if q.answer_docs & chosen] or live
    return Slice(initial, replay, asked)


def _fits(event: TraceEvent, max_bytes: int) -> bool:
    return event.op != "upsert" or len((event.text or "").encode("utf-8")) <= max_bytes


# --- where the faults fall -------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """A fault injected right after edit number `after_edit` (0-based) is produced."""

    after_edit: int
    kind: str


def plan_faults(n_edits: int, kills: int, seed: int) -> list[Fault]:
    """Seeded random points in the replay: `kills` streams kills (one of them restarts on a
    fresh disk, the host move), one worker kill in the second half (its cache is warm by
    then), one broker restart and one store outage; ordered by edit, kinds in KINDS order."""
    if n_edits < 1:
        raise ValueError("the replay needs at least one edit to inject faults between")
    rng = random.Random(seed)
    faults = [Fault(rng.randrange(n_edits), STREAMS_KILL) for _ in range(kills)]
    if kills:
        moved = rng.randrange(kills)
        faults[moved] = Fault(faults[moved].after_edit, HOST_MOVE)
    faults.append(Fault(rng.randrange(n_edits // 2, n_edits), WORKER_KILL))
    faults.append(Fault(rng.randrange(n_edits), BROKER_RESTART))
    faults.append(Fault(rng.randrange(n_edits), STORE_OUTAGE))
    return sorted(faults, key=lambda f: (f.after_edit, KINDS.index(f.kind)))


def fault_counts(done: Iterable[str]) -> dict[str, int]:
    """The JSON's `faults` object from the kinds injected; a host move is a streams kill."""
    counts = dict.fromkeys(KINDS, 0)
    for kind in done:
        counts[kind] += 1
        if kind == HOST_MOVE:
            counts[STREAMS_KILL] += 1
    return counts


# --- the oracle ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expected:
    """A document's final state according to the trace: version = the seq of its last event."""

    version: int
    deleted: bool
    text: str


def oracle(events: Iterable[TraceEvent]) -> dict[str, Expected]:
    """Every document the slice touches and its last event (deleted ones included)."""
    final: dict[str, Expected] = {}
    for e in events:
        final[e.doc_id] = Expected(e.seq, e.op == "delete", e.text or "")
    return final


def current_chunks(expected: Mapping[str, Expected], chunker: Chunker) -> dict[str, str]:
    """chunk_id -> content hash of every live document's final text, as the indexer chunks."""
    chunks: dict[str, str] = {}
    for doc_id, want in expected.items():
        if not want.deleted:
            chunks.update(chunker(doc_id, want.text))
    return chunks


@dataclass(frozen=True)
class IndexedDoc:
    """What the final index holds for one document (None: no record of it)."""

    version: int | None
    deleted: bool
    chunks: dict[str, str]  # chunk_id -> content hash


def versions_indexed(expected: Mapping[str, Expected], index: Mapping[str, IndexedDoc],
                     chunker: Chunker) -> int:
    """Documents whose final version is in the index: the record at that version, and for a
    live document exactly the chunks its final text gives (a deleted one holds none)."""
    count = 0
    for doc_id, want in expected.items():
        got = index.get(doc_id)
        if got is None or got.version != want.version or got.deleted != want.deleted:
            continue
        wanted = {} if want.deleted else chunker(doc_id, want.text)
        count += got.chunks == wanted
    return count


def lost_invalidations(held: Iterable[Mapping], current: Mapping[str, str]) -> int:
    """Cache entries still held whose chunk refs name a chunk version no longer current
    (`held`: the workers' `/v1/cache` items; `current`: chunk_id -> content hash)."""
    return sum(
        any(current.get(r["chunk_id"]) != r["content_hash"] for r in entry.get("chunk_refs", ()))
        for entry in held
    )


# --- per query -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Asked:
    """One answered query: the versions of the chunks its prompt used, the versions the
    app's docs table had confirmed just before it was asked, and the KV it was served."""

    chunk_versions: tuple[tuple[str, int], ...]  # (doc_id, version) per chunk of the prompt
    table_versions: Mapping[str, int]
    cached_tokens: int
    at: float = 0.0  # when it was answered (the benchmark's monotonic clock)
    ttft_ms: float = 0.0  # from the question to the first token: retrieval and routing too


def stale(asked: Asked) -> bool:
    """Served KV (a cache hit) built on a chunk older than the version the app had already
    indexed: the prompt's KV is of a chunk version no longer current."""
    return asked.cached_tokens > 0 and any(
        version < asked.table_versions.get(doc_id, version)
        for doc_id, version in asked.chunk_versions
    )


# --- outages: what the query load got while a fault lasted -------------------------------------
@dataclass(frozen=True)
class Outage:
    """One fault from its injection until the part was back (ready again, restarted)."""

    kind: str
    start: float
    end: float


def outage_figures(outages: Sequence[Outage], asked: Sequence[Asked],
                   failed_at: Sequence[float]) -> dict[str, Any]:
    """Queries answered and failed while each fault lasted, and the answered ones' TTFT
    (beside every answer's): an optimisation must keep answering (cold where it must)
    while its parts are down."""
    rows = []
    for o in outages:
        answered = [a.ttft_ms for a in asked if o.start <= a.at <= o.end]
        rows.append({"kind": o.kind, "seconds": round(o.end - o.start, 1),
                     "answered": len(answered),
                     "errors": sum(o.start <= t <= o.end for t in failed_at),
                     "ttft_p50_ms": _p50(answered)})
    during = [a.ttft_ms for a in asked if any(o.start <= a.at <= o.end for o in outages)]
    return {"ttft_p50_ms": _p50([a.ttft_ms for a in asked]),
            "answered_during_outage": len(during),
            "errors_during_outage": sum(any(o.start <= t <= o.end for o in outages)
                                        for t in failed_at),
            "outage_ttft_p50_ms": _p50(during), "outages": rows}


def _p50(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


# --- the report ------------------------------------------------------------------------------
def recovery_figures(seconds: Sequence[float]) -> dict[str, float | None]:
    if not seconds:
        return {"streams_recovery_s_p50": None, "streams_recovery_s_max": None}
    return {"streams_recovery_s_p50": round(statistics.median(seconds), 1),
            "streams_recovery_s_max": round(max(seconds), 1)}


def phase_seconds(timeline: Sequence[tuple[float, str]]) -> dict[str, float]:
    """Seconds spent in each state of the ready probe after a kill (`down`: no process
    answering yet; then the app's reasons, `recovering tables` covering the consumer group's
    rebalance and the changelogs' replay), from (seconds after the kill, state) changes."""
    out: dict[str, float] = {}
    for (at, state), (until, _) in zip(timeline, timeline[1:], strict=False):
        key = re.sub(r"\d+", "N", state.split(" (")[0])  # "re-indexing 3 documents": one kind
        out[key] = round(out.get(key, 0.0) + until - at, 1)
    return out


def phase_figures(timelines: Sequence[Sequence[tuple[float, str]]]) -> dict[str, float]:
    """The median seconds of each phase over the kills (0 where a kill skipped it)."""
    each = [phase_seconds(t) for t in timelines]
    names = dict.fromkeys(k for e in each for k in e)
    return {k: round(statistics.median(e.get(k, 0.0) for e in each), 1) for k in names}


# What the restarted app's own log says, in order: its first timestamped line (Python, torch
# and the models loaded, the broker and topics checked, Faust's worker starting), the consumer
# group joined (after the group dropped the killed member), the tables' changelogs read, and
# Faust ready (the probe's own `ready` comes after the index checks).
LOG_MARKS = (("log starts", ""), ("group joined", "Joined group"),
             ("tables recovered", "Resuming flow"), ("faust ready", "[^Worker]: Ready"))
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def log_marks(lines: Iterable[str], since_wall: float) -> dict[str, float]:
    """Seconds after `since_wall` (the kill, wall clock) of each `LOG_MARKS` line first seen
    in a Faust log (its default format, local time); a mark never logged is absent."""
    from datetime import datetime

    out: dict[str, float] = {}
    for line in lines:
        stamp = _STAMP.match(line)
        if stamp is None:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for name, text in LOG_MARKS:
            if name not in out and text in line:
                out[name] = round(at - since_wall, 1)
    return out


def mark_figures(marks: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The median of each mark over the kills that logged it."""
    names = [n for n, _ in LOG_MARKS if any(n in m for m in marks)]
    return {n: round(statistics.median(m[n] for m in marks if n in m), 1) for n in names}


def passed(result: Mapping, planned: Sequence[Fault] = ()) -> list[str]:
    """The issue's acceptance checks that fail on `result` (empty: all hold), and whether
    every `planned` fault was injected."""
    failing = []
    if planned and result["faults"] != fault_counts(f.kind for f in planned):
        failing.append(f"faults injected {result['faults']} differ from the plan")
    if result["kb_versions_indexed"] != result["kb_versions_expected"]:
        failing.append("kb_versions_indexed != kb_versions_expected")
    for key in ("lost_invalidations", "stale_served", "transient_dead_letters"):
        if result[key]:
            failing.append(f"{key} = {result[key]}")
    if result["worker_rewarm_s"] is None:
        failing.append("the killed worker did not hold its tracked prefixes again")
    return failing
