"""`ragwarm bench rag` end to end on a small synthetic trace (real models, local Qdrant)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ragwarm.bench.rag import rag

pytestmark = pytest.mark.integration

KEYS = {
    "chunks": int,
    "ingest_chunks_per_s": float,
    "query_ms_p50": float,
    "recall_at_3": float,
    "questions": int,
    "replay_events": int,
    "embeddings_computed": int,
    "embeddings_naive": int,
}


def _doc(topic: str, n: int = 30) -> str:
    body = " ".join(f"The {topic} setting number {i} controls {topic} behaviour." for i in range(n))
    return f"# {topic.title()}\n\n## Overview\n\n{body}\n\n## Details\n\n{body}"


def _trace(tmp_path: Path) -> tuple[Path, Path]:
    stamp = "2024-01-01T00:00:00Z"
    docs = {
        "tls.md": _doc("certificate"),
        "rbac.md": _doc("role binding"),
        "sync.md": _doc("sync wave"),
    }
    events = [
        {"seq": i, "timestamp": stamp, "op": "upsert", "doc_id": d, "text": t, "initial": True}
        for i, (d, t) in enumerate(docs.items())
    ]
    edited = docs["tls.md"].replace("number 3 ", "number three ", 1)
    events += [
        {"seq": 3, "timestamp": stamp, "op": "upsert", "doc_id": "tls.md", "text": edited},
        {"seq": 4, "timestamp": stamp, "op": "upsert", "doc_id": "tls.md", "text": edited},
        {"seq": 5, "timestamp": stamp, "op": "delete", "doc_id": "rbac.md", "text": None},
    ]
    questions = [
        {"qid": "a", "question": "How do I configure certificates?", "doc_id": "tls.md"},
        {
            "qid": "b",
            "question": "What do role bindings control?",
            "doc_id": "rbac.md",
            "removed_seq": 5,
        },
        {
            "qid": "c",
            "question": "How are sync waves ordered?",
            "doc_id": "sync.md",
            "first_seq": 4,
        },
        {"qid": "d", "question": "An unjudged question"},
    ]
    ev, qs = tmp_path / "events.jsonl", tmp_path / "questions.jsonl"
    ev.write_text("".join(json.dumps(e) + "\n" for e in events))
    qs.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return ev, qs


def test_bench_json_reports_every_figure(tmp_path: Path) -> None:
    events, questions = _trace(tmp_path)
    args = ["--events", str(events), "--questions", str(questions), "--json"]
    result = CliRunner().invoke(rag, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key, kind in KEYS.items():
        assert isinstance(report[key], kind), key
    # Live after the initial state (seq 2): a and b; c appears at seq 4; d names no document.
    assert report["questions"] == 2 and report["recall_at_3"] == 1.0
    assert report["replay_events"] == 3 and report["chunks"] >= 6
    # Two upserts of tls.md: naive re-embeds both versions, we embed the one edited chunk.
    assert report["embeddings_computed"] == 1
    assert report["embeddings_naive"] == 2 * report["chunks"] // 3
    assert report["questions_final"] == 2 and report["prefix_tokens_p50"] > 100


def test_bench_text_output(tmp_path: Path) -> None:
    events, questions = _trace(tmp_path)
    result = CliRunner().invoke(rag, ["--events", str(events), "--questions", str(questions)])
    assert result.exit_code == 0, result.output
    assert "recall@3" in result.output and "embeddings computed" in result.output


def test_bench_names_the_bad_line(tmp_path: Path) -> None:
    events, questions = _trace(tmp_path)
    events.write_text(events.read_text() + '{"seq": 9, "op": "upsert"}\n')
    result = CliRunner().invoke(rag, ["--events", str(events), "--questions", str(questions)])
    assert result.exit_code != 0
    assert f"{events}:7:" in result.output and "timestamp" in result.output
