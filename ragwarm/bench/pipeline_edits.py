"""The edits of `ragwarm bench pipeline`: which chunk to edit, and each edit's way to warm.

An edit changes a chunk of a prefix the worker holds; event-to-warm is measured from
producing the change to the worker's `stored` event for the prefix the question retrieves
afterwards, split into stages from the commands the app sends and the worker's events.
An edit that does not warm again in time is recorded as missed, with the reason the
commands and events show, and the run goes on (one slow edit must not hide the figures).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ragwarm.bench.stats import percentile
from schemas import ChunkRef, KbChange, WarmupCommand, WorkerEvent, encode
from schemas.topics import KB_CHANGES, RAG_QUERIES

# How long one stage of an edit is awaited before the edit counts as missed.
WAIT_S = 60.0


class Chunker(Protocol):
    def chunk_hashes(self, doc_id: str, text: str) -> dict[str, str]: ...


@dataclass
class EditOutcome:
    """One edit: its stages in ms from the change (None where not reached), or why it missed.

    `worker_busy` counts the other prefixes the worker stored between the app's prefill of
    the new prefix and its `stored` event: prefills queued ahead of it on the worker."""

    n: int
    doc_id: str
    indexed: float | None = None
    sent: float | None = None
    warm: float | None = None
    worker_busy: int = 0
    missed: str | None = None
    commands: dict[str, int] = field(default_factory=dict)
    # A missed edit only: the commands about its prefix or its edited chunk, in order.
    trail: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in asdict(self).items()}


def edits_inside(text: str, chunk_text: str, n: int):
    """Each way to add a sentence to a line of `chunk_text` in `text` (the first occurrence
    of the line, which may lie in another chunk: the caller checks which chunk changed)."""
    for line in chunk_text.splitlines():
        if len(line) > 30 and line in text:
            yield text.replace(line, f"{line} (Edit {n} for the pipeline benchmark.)", 1)


def edit_inside(text: str, chunk_text: str, n: int) -> str | None:
    """`text` with a sentence added to a line of `chunk_text` (so that chunk changes)."""
    return next(edits_inside(text, chunk_text, n), None)


def warm_chunk_edit(
    chunker: Chunker,
    latest: dict[str, KbChange],
    held: list,
    rows: list[dict],
    n: int,
    avoid: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[KbChange, ChunkRef] | None:
    """An edit that changes a chunk of the prefix the worker holds (`held`, its refs) and
    that the question still retrieves (`rows`), checked by chunking the edited text as the
    app will; a document in `avoid` (edited already) only when no other one can be edited.
    None when there is none."""
    texts = {(r["chunk_id"], r["content_hash"]): r["text"] for r in rows}
    refs = sorted(held, key=lambda r: r.chunk_id.rpartition("#")[0] in avoid)  # stable
    for ref in refs:
        doc_id = ref.chunk_id.rpartition("#")[0]
        chunk_text = texts.get((ref.chunk_id, ref.content_hash))
        if doc_id not in latest or chunk_text is None:
            continue
        for text in edits_inside(latest[doc_id].text or "", chunk_text, n):
            if chunker.chunk_hashes(doc_id, text).get(ref.chunk_id) != ref.content_hash:
                return KbChange(op="upsert", doc_id=doc_id, version=0, text=text), ref
    return None


def stage_times(
    commands: list[tuple[float, WarmupCommand]],
    seen: list[tuple[float, WorkerEvent]],
    t0: float,
    stale: ChunkRef,
    new_hash: str | None,
) -> dict[str, float | None]:
    """When (epoch s) each stage of an edit made at `t0` happened, None if not (yet):
    `indexed` the app's invalidation naming the `stale` ref, `sent` its first prefill of
    `new_hash`, `warm` the worker's `stored` event for it, or its first heartbeat after
    `indexed` listing it (held already)."""
    indexed = min(
        (at for at, c in commands if at >= t0 and c.op == "invalidate" and stale in c.chunk_refs),
        default=None,
    )
    sent = min(
        (at for at, c in commands
         if at >= t0 and c.op == "prefill" and c.prefix_hash == new_hash),
        default=None,
    )
    warm = min(
        (at for at, e in seen if at >= t0 and e.kind == "stored" and e.prefix_hash == new_hash),
        default=None,
    )
    if indexed is not None and new_hash is not None:
        # The edited question may now retrieve a prefix the worker already held (the edited
        # chunk left its top-k): no prefill, no `stored` event; a heartbeat lists it.
        held = (at for at, e in seen if at >= indexed and e.kind == "heartbeat"
                and new_hash in e.warm_prefixes)
        warm = min((t for t in (warm, next(held, None)) if t is not None), default=None)
    return {"indexed": indexed, "sent": sent, "warm": warm}


def commands_between(
    commands: list[tuple[float, WarmupCommand]], start: float, end: float
) -> dict[str, int]:
    """How many commands of each op (prefills by reason) the app sent in [start, end]."""
    counts: dict[str, int] = {}
    for at, cmd in commands:
        if start <= at <= end:
            key = f"prefill ({cmd.reason})" if cmd.op == "prefill" else cmd.op
            counts[key] = counts.get(key, 0) + 1
    return counts


def command_trail(
    commands: list[tuple[float, WarmupCommand]], start: float, end: float, prefix_hash: str,
    stale: ChunkRef,
) -> list[str]:
    """The commands in [start, end] about `prefix_hash` or naming the `stale` ref, each as
    'ms after start: op prefix (reason)': where a missed edit's way stopped."""
    return [
        f"{(at - start) * 1000:.0f} ms: {c.op} {(c.prefix_hash or '-')[:12]} ({c.reason})"
        for at, c in commands
        if start <= at <= end and (c.prefix_hash == prefix_hash or stale in c.chunk_refs)
    ]


def stored_between(
    seen: list[tuple[float, WorkerEvent]], start: float, end: float, other_than: str
) -> int:
    """Prefixes other than `other_than` the worker stored in (start, end)."""
    return sum(
        1 for at, e in seen
        if start < at < end and e.kind == "stored" and e.prefix_hash != other_than
    )


def miss_reason(
    times: dict[str, float | None],
    seen: list[tuple[float, WorkerEvent]],
    t0: float,
    new_hash: str | None,
) -> str:
    """Why an edit did not warm again, from the stage it stopped at and the worker's events."""
    if times["indexed"] is None:
        return f"the app sent no invalidation of the edited chunk within {WAIT_S:.0f} s"
    if new_hash is None:
        return "the question retrieved nothing after the edit"
    if times["sent"] is None:
        return (f"the app sent no prefill of the new prefix {new_hash[:12]} within "
                f"{WAIT_S:.0f} s of the invalidation")
    refused = [e for at, e in seen
               if at >= t0 and e.prefix_hash == new_hash and e.kind in ("refused", "expired")]
    if refused:
        return f"the worker {refused[0].kind} the prefill: {refused[0].reason or 'no reason'}"
    return f"the prefill of {new_hash[:12]} was sent, no stored event within {WAIT_S:.0f} s"


def stage_figures(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 and p99 of each stage of event-to-warm over the edits that warmed again (None
    when none did), and how many were measured and missed."""
    done = [o for o in outcomes if o.get("missed") is None and o.get("warm") is not None]
    names = {"indexed": "event_to_indexed", "sent": "event_to_commands", "warm": "event_to_warm"}
    out: dict[str, Any] = {"edits_warm": len(done),
                           "edits_missed": sum(1 for o in outcomes if o.get("missed"))}
    for key, name in names.items():
        values = [o[key] for o in done if o.get(key) is not None]
        for q in (50, 99):
            out[f"{name}_ms_p{q}"] = round(percentile(values, q), 1) if values else None
    return out


class EditRun:
    """Warms the hot questions on the bench's worker, then edits a warm chunk of one at a
    time and follows each edit to its new prefix being stored (`EditOutcome`)."""

    def __init__(self, b, prompts, latest: dict[str, KbChange]) -> None:
        self.b, self.prompts, self.latest = b, prompts, latest
        self.warm: list[tuple[str, str]] = []  # (question, the prefix the worker holds for it)
        self.edited: set[str] = set()

    def warm_questions(self, questions: list[str]) -> None:
        for question in questions:
            event, _ = self.prompts.query_event(question)
            for _ in range(3):
                self.b.send(RAG_QUERIES, "default", encode(event))
            self.b.producer.flush()
            try:
                self.b.wait_event("stored", event.prefix_hash, 0.0, 2 * WAIT_S)
            except TimeoutError as exc:
                self.b.say(f"hot question not warm, left out: {exc}")
                continue
            self.warm.append((question, event.prefix_hash))

    def pick(self, n: int) -> tuple[int, KbChange, ChunkRef] | None:
        """The edit `n`: the first warm question, from the n-th on, with an editable chunk."""
        for k in range(len(self.warm)):
            i = (n + k) % len(self.warm)
            rows = self.refresh(i)
            held = self.b.stored_refs(self.warm[i][1])
            edit = warm_chunk_edit(self.prompts, self.latest, held, rows, n, self.edited)
            if edit is not None:
                return i, edit[0], edit[1]
        return None

    def refresh(self, i: int) -> list:
        """Question i's retrieval now (its rows); its record becomes the prefix this
        retrieval builds when the worker stored that one. An edit re-prefills every prefix
        it invalidated, so two questions sharing the edited chunk both moved, and the
        record of the one not edited was left on a prefix no longer held."""
        question, held_hash = self.warm[i]
        event, rows = self.prompts.query_event(question)
        if event.chunk_refs and event.prefix_hash != held_hash:
            if self.b.stored_refs(event.prefix_hash):
                self.warm[i] = (question, event.prefix_hash)
        return rows

    def edit(self, n: int, version: int) -> EditOutcome | None:
        picked = self.pick(n)
        if picked is None:
            return None
        i, change, stale = picked
        change = change.model_copy(update={"version": version})
        question, held = self.warm[i]
        t0 = time.time()
        self.b.send(KB_CHANGES, change.doc_id, encode(change))
        self.b.producer.flush()
        self.latest[change.doc_id] = change
        self.edited.add(change.doc_id)
        new_hash = None
        times = self._wait(lambda t: t["indexed"], t0, stale, None)
        if times["indexed"] is not None:
            event, _ = self.prompts.query_event(question)
            new_hash = event.prefix_hash if event.chunk_refs else None
            self.warm[i] = (question, new_hash or self.warm[i][1])
        if new_hash is not None:
            times = self._wait(lambda t: t["warm"], t0, stale, new_hash)
        end = times["warm"] or time.time()
        outcome = EditOutcome(n=n + 1, doc_id=change.doc_id, commands=commands_between(
            self.b.commands, t0, end))
        for key, at in times.items():
            setattr(outcome, key, None if at is None else (at - t0) * 1000)
        if times["warm"] is None:
            outcome.missed = miss_reason(times, self.b.seen, t0, new_hash)
            outcome.trail = command_trail(self.b.commands, t0, end, held, stale)
        elif times["sent"] is not None:
            outcome.worker_busy = stored_between(self.b.seen, times["sent"], end, new_hash or "")
        return outcome

    def _wait(self, done, t0: float, stale: ChunkRef, new_hash: str | None) -> dict:
        deadline = time.monotonic() + WAIT_S
        while True:
            self.b.poll_events()
            times = stage_times(self.b.commands, self.b.seen, t0, stale, new_hash)
            if done(times) is not None or time.monotonic() > deadline:
                return times
            time.sleep(0.05)


def measure_edits(b, prompts, latest: dict[str, KbChange], questions: list[str],
                  edits: int) -> list[dict[str, Any]]:
    """Per edit, its outcome (`EditOutcome.as_dict`); never raises for a slow or lost edit."""
    run = EditRun(b, prompts, latest)
    run.warm_questions(questions)
    b.say(f"{len(run.warm)} hot prefixes warm; applying {edits} edits")
    outcomes: list[dict[str, Any]] = []
    if not run.warm:
        return outcomes
    version = max(c.version for c in latest.values()) + 1
    for n in range(edits):
        outcome = run.edit(n, version + n)
        if outcome is None:
            b.say(f"edit {n + 1}/{edits}: no warm chunk of any hot question to edit; skipped")
            continue
        outcomes.append(outcome.as_dict())
        what = (f"missed: {outcome.missed} (trail: {outcome.trail})" if outcome.missed else
                f"warm again in {outcome.warm:.0f} ms (indexed {outcome.indexed:.0f}, "
                f"sent {outcome.sent or 0:.0f}, {outcome.worker_busy} other prefills first)")
        b.say(f"edit {n + 1}/{edits}: {outcome.doc_id} {what}; commands {outcome.commands}")
    return outcomes
