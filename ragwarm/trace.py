"""Reader for replayable KB traces: change events and questions as JSONL, validated per line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from schemas import KbChange

Scalar = str | int | float | bool | None
M = TypeVar("M", bound=BaseModel)


class TraceError(ValueError):
    """A trace file that cannot be used; names the file and the 1-based line."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = Path(path)
        self.line = line
        self.message = message


class TraceEvent(BaseModel):
    """One KB change of a trace; fields beyond the required ones land in `metadata`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=0)
    timestamp: datetime
    op: Literal["upsert", "delete"]
    doc_id: str = Field(min_length=1, max_length=1024)
    text: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("timestamp")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        # Naive stamps are read as UTC so every trace sorts on one clock.
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    @property
    def initial(self) -> bool:
        return self.metadata.get("initial") is True

    def to_change(self, tenant: str = "default") -> KbChange:
        """The `kb.changes` record for this event; the trace `seq` is the document version."""
        return KbChange(
            op=self.op,
            doc_id=self.doc_id,
            version=self.seq,
            tenant=tenant,
            text=self.text if self.op == "upsert" else None,
            timestamp=self.timestamp,
            metadata={k: _scalar(v) for k, v in self.metadata.items()},
        )


class Question(BaseModel):
    """One question of a trace, with the documents that answer it and when it exists."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    qid: str = Field(min_length=1, max_length=1024)
    question: str = Field(min_length=1, max_length=8192)
    doc_id: str | None = None
    answer_doc_ids: tuple[str, ...] = ()
    first_seq: int | None = None
    removed_seq: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def answer_docs(self) -> frozenset[str]:
        """Every document accepted as answering this question (empty: not judged)."""
        docs = set(self.answer_doc_ids)
        if self.doc_id:
            docs.add(self.doc_id)
        return frozenset(docs)

    def live_at(self, seq: int) -> bool:
        """Whether the question exists once events up to `seq` have been applied."""
        if self.first_seq is not None and self.first_seq > seq:
            return False
        return self.removed_seq is None or self.removed_seq > seq


_EVENT_FIELDS = frozenset(TraceEvent.model_fields) - {"metadata"}
_QUESTION_FIELDS = frozenset(Question.model_fields) - {"metadata"}


def read_events(path: Path | str) -> Iterator[TraceEvent]:
    """Stream the events of a trace; raise `TraceError` at the first invalid line."""
    previous: int | None = None
    for line, obj in _records(path):
        event = _validate(TraceEvent, _split(obj, _EVENT_FIELDS), path, line)
        if event.op == "upsert" and event.text is None:
            raise TraceError(path, line, "text: required (a string) for op 'upsert'")
        if previous is not None and event.seq <= previous:
            raise TraceError(path, line, f"seq: {event.seq} does not increase (after {previous})")
        previous = event.seq
        yield event


def read_questions(path: Path | str) -> list[Question]:
    """All questions of a trace; raise `TraceError` at the first invalid or repeated one."""
    questions: list[Question] = []
    seen: set[str] = set()
    for line, obj in _records(path):
        question = _validate(Question, _split(obj, _QUESTION_FIELDS), path, line)
        if question.qid in seen:
            raise TraceError(path, line, f"qid: {question.qid!r} appears twice")
        seen.add(question.qid)
        questions.append(question)
    return questions


@dataclass(frozen=True)
class TraceSplit:
    """A trace cut into the initial KB state and the changes replayed after it."""

    initial: list[TraceEvent]
    rest: list[TraceEvent] = field(default_factory=list)

    @property
    def initial_seq(self) -> int:
        """The last seq of the initial state (-1 for an empty one)."""
        return self.initial[-1].seq if self.initial else -1


def split_initial(events: Iterable[TraceEvent]) -> TraceSplit:
    """Events marked `initial` form the starting state; with none marked, all of them do."""
    events = list(events)
    if not any(e.initial for e in events):
        return TraceSplit(initial=events)
    cut = next((i for i, e in enumerate(events) if not e.initial), len(events))
    if any(e.initial for e in events[cut:]):
        late = next(e for e in events[cut:] if e.initial)
        raise ValueError(f"seq {late.seq}: event marked initial after non-initial events")
    return TraceSplit(initial=events[:cut], rest=events[cut:])


def final_state(events: Iterable[TraceEvent]) -> dict[str, TraceEvent]:
    """The last upsert of every document still present once all events are applied."""
    state: dict[str, TraceEvent] = {}
    for event in events:
        if event.op == "delete":
            state.pop(event.doc_id, None)
        else:
            state[event.doc_id] = event
    return state


def _records(path: Path | str) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as handle:
        for line, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise TraceError(path, line, f"not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(path, line, "a line must hold one JSON object")
            yield line, obj


def _split(obj: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    fields = {k: v for k, v in obj.items() if k in known}
    fields["metadata"] = {k: v for k, v in obj.items() if k not in known}
    return fields


def _validate(model: type[M], fields: dict[str, Any], path: Path | str, line: int) -> M:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "<record>"
        raise TraceError(path, line, f"{where}: {err['msg']}") from None


def _scalar(value: Any) -> Scalar:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, sort_keys=True)


def trace_changes(events: Path, limit: int | None = None) -> list[KbChange]:
    """The trace's events as KB changes, the first `limit` of them (all when None)."""
    changes = [e.to_change() for e in read_events(events)]
    return changes[:limit] if limit else changes
