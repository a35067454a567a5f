"""The trace reader: required fields, extras kept as metadata, errors that name the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragwarm.trace import (
    TraceError,
    final_state,
    read_events,
    read_questions,
    split_initial,
)


def _write(path: Path, rows: list[object]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _event(seq: int, op: str = "upsert", doc: str = "a.md", **extra: object) -> dict[str, object]:
    text = f"text {seq}" if op == "upsert" else None
    return {
        "seq": seq,
        "timestamp": "2024-01-01T00:00:00+01:00",
        "op": op,
        "doc_id": doc,
        "text": text,
        **extra,
    }


def test_events_keep_extra_fields_as_metadata(tmp_path: Path) -> None:
    path = _write(tmp_path / "e.jsonl", [_event(0, initial=True, commit="abc", lines_added=3)])
    [event] = read_events(path)
    assert event.seq == 0 and event.doc_id == "a.md" and event.text == "text 0"
    assert event.metadata == {"initial": True, "commit": "abc", "lines_added": 3}
    assert event.initial


def test_naive_timestamps_are_read_as_utc(tmp_path: Path) -> None:
    row = _event(0) | {"timestamp": "2024-01-01T00:00:00"}
    [event] = read_events(_write(tmp_path / "e.jsonl", [row]))
    assert event.timestamp.utcoffset() is not None


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path / "e.jsonl", [_event(0), "", _event(1)])
    assert [e.seq for e in read_events(path)] == [0, 1]


@pytest.mark.parametrize(
    ("row", "line", "needle"),
    [
        ("{not json", 2, "not valid JSON"),
        ("[1, 2]", 2, "one JSON object"),
        ({"seq": 5, "op": "upsert", "doc_id": "a", "text": "x"}, 2, "timestamp"),
        (_event(5) | {"op": "move"}, 2, "op"),
        (_event(5) | {"text": None}, 2, "text: required"),
        (_event(0), 2, "does not increase"),
        (_event(5) | {"seq": "five"}, 2, "seq"),
    ],
)
def test_bad_event_lines_name_file_line_and_field(
    tmp_path: Path, row: object, line: int, needle: str
) -> None:
    path = _write(tmp_path / "e.jsonl", [_event(0), row])
    with pytest.raises(TraceError) as info:
        list(read_events(path))
    assert info.value.line == line
    assert needle in str(info.value)
    assert str(path) in str(info.value)


def test_delete_without_text_is_valid(tmp_path: Path) -> None:
    path = _write(tmp_path / "e.jsonl", [_event(0), _event(1, op="delete")])
    events = list(read_events(path))
    change = events[1].to_change()
    assert change.op == "delete" and change.text is None and change.version == 1


def test_to_change_uses_seq_as_version_and_scalar_metadata(tmp_path: Path) -> None:
    row = _event(7, subject="fix", files=["a", "b"])
    [event] = read_events(_write(tmp_path / "e.jsonl", [row]))
    change = event.to_change(tenant="t1")
    assert (change.version, change.tenant, change.text) == (7, "t1", "text 7")
    assert change.metadata == {"subject": "fix", "files": '["a", "b"]'}


def test_split_initial_uses_marked_events() -> None:
    events = _events([_event(0, initial=True), _event(1, initial=True), _event(2, initial=False)])
    split = split_initial(events)
    assert [e.seq for e in split.initial] == [0, 1]
    assert [e.seq for e in split.rest] == [2]
    assert split.initial_seq == 1


def test_split_initial_without_marks_takes_everything() -> None:
    split = split_initial(_events([_event(0), _event(1)]))
    assert len(split.initial) == 2 and split.rest == []


def test_split_initial_refuses_late_initial_events() -> None:
    events = _events([_event(0, initial=True), _event(1), _event(2, initial=True)])
    with pytest.raises(ValueError, match="seq 2"):
        split_initial(events)


def test_final_state_drops_deleted_documents_and_keeps_last_upserts() -> None:
    events = _events(
        [_event(0, doc="a"), _event(1, doc="b"), _event(2, doc="a"), _event(3, "delete", doc="b")]
    )
    state = final_state(events)
    assert list(state) == ["a"] and state["a"].seq == 2


def test_questions_with_optional_fields(tmp_path: Path) -> None:
    rows = [
        {
            "qid": "q1",
            "question": "Why?",
            "doc_id": "a.md",
            "first_seq": 3,
            "removed_seq": 9,
            "kind": "faq",
        },
        {"qid": "q2", "question": "How?", "answer_doc_ids": ["b.md", "c.md"]},
        {"qid": "q3", "question": "What?"},
    ]
    q1, q2, q3 = read_questions(_write(tmp_path / "q.jsonl", rows))
    assert q1.metadata == {"kind": "faq"}
    assert q1.answer_docs == {"a.md"} and q2.answer_docs == {"b.md", "c.md"}
    assert not q3.answer_docs
    assert [q1.live_at(s) for s in (2, 3, 8, 9)] == [False, True, True, False]
    assert q2.live_at(0) and q3.live_at(10**9)


def test_repeated_qid_is_an_error(tmp_path: Path) -> None:
    rows = [{"qid": "q1", "question": "a"}, {"qid": "q1", "question": "b"}]
    with pytest.raises(TraceError, match=r"q\.jsonl:2: qid"):
        read_questions(_write(tmp_path / "q.jsonl", rows))


def test_question_without_text_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="question"):
        read_questions(_write(tmp_path / "q.jsonl", [{"qid": "q1"}]))


def _events(rows: list[dict[str, object]]) -> list:
    from ragwarm.trace import TraceEvent

    out = []
    for row in rows:
        known = {k: v for k, v in row.items() if k in TraceEvent.model_fields}
        extra = {k: v for k, v in row.items() if k not in TraceEvent.model_fields}
        out.append(TraceEvent.model_validate(known | {"metadata": extra}))
    return out
