"""A document history as trace records: KB change events and the questions live in them.

Pure: it takes commits already read from git (see `git.py`) and returns the JSON records of
the shared trace format (`shared/data/README.md`), so it is tested without a repository.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ragwarm.tracebuild.headings import question_headings


@dataclass(frozen=True)
class Change:
    """One document touched by a commit: its new text, or None when it was deleted."""

    doc_id: str
    text: str | None


@dataclass(frozen=True)
class Commit:
    sha: str
    timestamp: str  # ISO-8601 with offset, as git prints %cI
    subject: str
    changes: tuple[Change, ...]
    initial: bool = False  # the snapshot of the base commit, not an edit


@dataclass
class _Open:
    """A question heading while it is in its document: from `first_seq` until removed."""

    record: dict[str, Any]


@dataclass
class History:
    """Builds the trace in commit order; `events` and `questions` are the output records."""

    max_chars: int = 20_000
    ask_headings: bool = True
    events: list[dict[str, Any]] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    _texts: dict[str, str] = field(default_factory=dict)  # doc -> trimmed text now
    _open: dict[tuple[str, str], _Open] = field(default_factory=dict)

    def add(self, commit: Commit) -> None:
        for change in commit.changes:
            if change.text is None:
                self._delete(commit, change.doc_id)
            else:
                self._upsert(commit, change.doc_id, change.text)

    def _upsert(self, commit: Commit, doc_id: str, text: str) -> None:
        trimmed = text[: self.max_chars]
        previous = self._texts.get(doc_id)
        event = self._event(commit, "upsert", doc_id, trimmed)
        event.update(truncated=len(text) > self.max_chars, full_chars=len(text),
                     text_changed=trimmed != previous)
        self._texts[doc_id] = trimmed
        if self.ask_headings:
            self._track(commit, event["seq"], doc_id, trimmed)

    def _delete(self, commit: Commit, doc_id: str) -> None:
        if self._texts.pop(doc_id, None) is None:
            return  # never seen (outside the window or filtered): nothing to delete
        seq = self._event(commit, "delete", doc_id, None)["seq"]
        self._close(commit, seq, doc_id, keep=set())

    def _event(self, commit: Commit, op: Literal["upsert", "delete"], doc_id: str,
               text: str | None) -> dict[str, Any]:
        event = {"seq": len(self.events), "commit": commit.sha, "timestamp": commit.timestamp,
                 "op": op, "doc_id": doc_id, "text": text, "initial": commit.initial,
                 "subject": commit.subject}
        self.events.append(event)
        return event

    def _track(self, commit: Commit, seq: int, doc_id: str, text: str) -> None:
        """Open the question headings new in this version; close those it dropped."""
        asked = {h.question: h for h in question_headings(text)}
        self._close(commit, seq, doc_id, keep=set(asked))
        for title, heading in asked.items():
            if (doc_id, title) in self._open:
                self._open[(doc_id, title)].record["answer_section"] = heading.answer
                continue
            record = {"qid": f"q{len(self.questions):04d}", "question": title,
                      "doc_id": doc_id, "kind": "question_heading", "first_seq": seq,
                      "first_commit": commit.sha, "first_timestamp": commit.timestamp,
                      "removed_seq": None, "removed_commit": None, "live_at_end": True,
                      "answer_section": heading.answer}
            self.questions.append(record)
            self._open[(doc_id, title)] = _Open(record)

    def _close(self, commit: Commit, seq: int, doc_id: str, keep: set[str]) -> None:
        for key in [k for k in self._open if k[0] == doc_id and k[1] not in keep]:
            record = self._open.pop(key).record
            record.update(removed_seq=seq, removed_commit=commit.sha, live_at_end=False)

    def stats(self) -> dict[str, Any]:
        """The counts a reader checks first (as `shared/data/argocd/stats.json` has them)."""
        ops = Counter((e["op"], e["initial"]) for e in self.events)
        edits = Counter(e["doc_id"] for e in self.events if not e["initial"])
        return {
            "events": len(self.events),
            "initial_upserts": ops[("upsert", True)],
            "upserts": ops[("upsert", False)],
            "deletes": ops[("delete", False)],
            "docs": len({e["doc_id"] for e in self.events}),
            "docs_edited_more_than_once": sum(1 for n in edits.values() if n > 1),
            "docs_edited_ten_times": sum(1 for n in edits.values() if n >= 10),
            "unchanged_upserts": sum(1 for e in self.events
                                     if e["op"] == "upsert" and not e["text_changed"]),
            "commits": len({e["commit"] for e in self.events}),
            "first_timestamp": self.events[0]["timestamp"] if self.events else None,
            "last_timestamp": self.events[-1]["timestamp"] if self.events else None,
            "questions": len(self.questions),
            "questions_live_at_end": sum(1 for q in self.questions if q["live_at_end"]),
        }


def build(commits: Iterable[Commit], *, max_chars: int = 20_000,
          ask_headings: bool = True) -> History:
    history = History(max_chars=max_chars, ask_headings=ask_headings)
    for commit in commits:
        history.add(commit)
    return history


def jsonl(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    import json

    for record in records:
        yield json.dumps(record, ensure_ascii=False) + "\n"
