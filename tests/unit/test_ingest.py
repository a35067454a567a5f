"""Ingest without Kafka: which files become changes, their ids and versions, and what is skipped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ragwarm.client.ingest import (
    IngestReport,
    Skipped,
    decode_text,
    event_change,
    file_change,
    list_folder,
    summary_lines,
    trace_events,
)
from ragwarm.client.producer import DeliveryFailure
from ragwarm.trace import TraceEvent
from schemas import MAX_TEXT_BYTES, KbChange


def test_decode_text_accepts_utf8_and_drops_a_bom() -> None:
    assert decode_text("café ✓".encode()) == "café ✓"
    assert decode_text(b"\xef\xbb\xbfhello") == "hello"


@pytest.mark.parametrize(
    ("data", "kind", "detail"),
    [
        (b"abc\xff", "not UTF-8", "0xff at offset 3"),
        (b"\x89PNG\r\n\x1a\n", "not UTF-8", "0x89 at offset 0"),
        (b"text\x00more", "binary", "offset 4"),
    ],
)
def test_decode_text_names_why_bytes_are_not_text(data: bytes, kind: str, detail: str) -> None:
    result = decode_text(data)
    assert isinstance(result, Skipped)
    assert result.kind == kind and detail in result.detail


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_list_folder_keeps_text_files_in_path_order_and_counts_the_rest(tmp_path: Path) -> None:
    _write(tmp_path / "b.md", "b")
    _write(tmp_path / "a" / "z.txt", "z")
    _write(tmp_path / "a" / "y.RST", "y")
    _write(tmp_path / "logo.png", b"\x89PNG")
    _write(tmp_path / "Makefile", "all:")
    _write(tmp_path / ".git" / "HEAD.md", "hidden")
    _write(tmp_path / ".draft.md", "hidden")
    files, ignored = list_folder(tmp_path)
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["a/y.RST", "a/z.txt", "b.md"]
    assert ignored == {"(none)": 1, ".png": 1}


def test_file_change_uses_the_relative_path_and_mtime(tmp_path: Path) -> None:
    path = _write(tmp_path / "guide" / "setup.md", "# Setup\n")
    os.utime(path, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    change = file_change(tmp_path, path, "acme", MAX_TEXT_BYTES)
    assert isinstance(change, KbChange)
    assert (change.op, change.doc_id, change.tenant) == ("upsert", "guide/setup.md", "acme")
    assert change.text == "# Setup\n"
    assert change.version == 1_700_000_000_123_456_789
    assert change.timestamp.isoformat() == "2023-11-14T22:13:20.123456+00:00"


def test_an_unchanged_file_keeps_its_version_and_an_edit_raises_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.md", "one")
    first = file_change(tmp_path, path, "t", MAX_TEXT_BYTES)
    again = file_change(tmp_path, path, "t", MAX_TEXT_BYTES)
    assert first == again
    stat = path.stat()
    path.write_text("two")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    edited = file_change(tmp_path, path, "t", MAX_TEXT_BYTES)
    assert isinstance(first, KbChange) and isinstance(edited, KbChange)
    assert edited.version > first.version


def test_file_change_skips_oversized_and_undecodable_files(tmp_path: Path) -> None:
    big = file_change(tmp_path, _write(tmp_path / "big.md", "x" * 101), "t", 100)
    bad = file_change(tmp_path, _write(tmp_path / "bad.md", b"\xc3\x28"), "t", 100)
    gone = file_change(tmp_path, tmp_path / "gone.md", "t", 100)
    assert big == Skipped("big.md", "too large", "101 bytes > 100")
    assert isinstance(bad, Skipped) and (bad.source, bad.kind) == ("bad.md", "not UTF-8")
    assert isinstance(gone, Skipped) and (gone.source, gone.kind) == ("gone.md", "unreadable")


def _event(**fields: object) -> TraceEvent:
    base: dict[str, object] = {
        "seq": 7,
        "timestamp": "2024-01-02T03:04:05Z",
        "op": "upsert",
        "doc_id": "docs/a.md",
        "text": "hello",
    }
    return TraceEvent.model_validate(base | fields)


def test_event_change_uses_seq_as_version_and_keeps_scalar_extras() -> None:
    event = _event(metadata={"commit": "abc", "initial": True, "lines_added": 3})
    change = event_change(event, "t1", MAX_TEXT_BYTES)
    assert isinstance(change, KbChange)
    assert (change.doc_id, change.version, change.tenant, change.text) == (
        "docs/a.md",
        7,
        "t1",
        "hello",
    )
    assert change.metadata == {"commit": "abc", "initial": True, "lines_added": 3}


def test_event_change_skips_text_over_the_limit_and_passes_deletes() -> None:
    assert event_change(_event(text="x" * 11), "t", 10) == Skipped(
        "seq 7 (docs/a.md)", "too large", "11 bytes > 10"
    )
    delete = event_change(_event(op="delete", text=None), "t", 10)
    assert isinstance(delete, KbChange) and delete.op == "delete" and delete.text is None


def test_trace_events_can_stop_at_the_initial_state(tmp_path: Path) -> None:
    rows = [
        {
            "seq": 1,
            "timestamp": "2024-01-01T00:00:00Z",
            "op": "upsert",
            "doc_id": "a",
            "text": "a0",
            "initial": True,
        },
        {
            "seq": 2,
            "timestamp": "2024-01-02T00:00:00Z",
            "op": "upsert",
            "doc_id": "a",
            "text": "a1",
            "initial": False,
        },
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [e.seq for e in trace_events(path, initial_only=False)] == [1, 2]
    assert [e.seq for e in trace_events(path, initial_only=True)] == [1]


def test_report_is_an_error_only_when_nothing_could_be_sent_or_delivery_failed() -> None:
    skip = Skipped("a.md", "binary", "NUL byte at offset 0")
    assert IngestReport("kb.changes").ok  # an empty folder is not an error
    assert IngestReport("kb.changes", sent=1, skipped=[skip]).ok
    assert not IngestReport("kb.changes", skipped=[skip]).ok
    failure = DeliveryFailure("a.md", 1, "MessageSizeTooLargeError")
    assert not IngestReport("kb.changes", sent=3, failed=[failure]).ok


def test_summary_names_topic_counts_reasons_and_time() -> None:
    report = IngestReport(
        "kb.changes",
        sent=2,
        skipped=[
            Skipped("a", "binary", "x"),
            Skipped("b", "too large", "y"),
            Skipped("c", "binary", "z"),
        ],
        ignored_suffixes={".png": 3},
        elapsed_s=1.5,
    )
    text = "\n".join(summary_lines(report, "127.0.0.1:39092"))
    assert "kb.changes @ 127.0.0.1:39092" in text
    assert "sent:     2" in text and "skipped:  3" in text
    assert "binary: 2" in text and "too large: 1" in text
    assert "3 non-text files (.png ×3)" in text
    assert "elapsed:  1.50 s" in text
