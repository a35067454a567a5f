"""`ragwarm trace from-git` on a real repository made here: the trace the benchmarks read."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ragwarm.cli.trace import trace
from ragwarm.trace import read_events, read_questions

pytestmark = pytest.mark.integration


def _git(repo: Path, *args: str, date: str | None = None) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)


def _commit(repo: Path, files: dict[str, str | None], date: str) -> None:
    for name, text in files.items():
        path = repo / name
        if text is None:
            _git(repo, "rm", "-q", name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        _git(repo, "add", name)
    _git(repo, "commit", "-q", "-m", f"edit at {date}", date=date)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "kb"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, {"docs/faq.md": "# FAQ\n## How do I start?\nRun it.\n",
                   "docs/img.png": "\0binary", "src/x.md": "not docs"}, "2024-01-01T10:00:00")
    _commit(repo, {"docs/faq.md": "# FAQ\n## How do I start?\nRun it twice.\n"
                                  "## Why is it slow?\nCPU.\n"}, "2024-02-01T10:00:00")
    _commit(repo, {"docs/guide.md": "# Guide\n"}, "2024-03-01T10:00:00")
    _commit(repo, {"docs/guide.md": None}, "2024-04-01T10:00:00")
    return repo


def test_a_history_becomes_a_trace_the_reader_accepts(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    result = CliRunner().invoke(trace, ["from-git", str(repo), "--out", str(out),
                                        "--include", "docs/*", "--since", "2024-01-15"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["op"], e["doc_id"], e["initial"]) for e in events] == [
        ("upsert", "docs/faq.md", True),  # the state before --since; the png is binary
        ("upsert", "docs/faq.md", False),
        ("upsert", "docs/guide.md", False),
        ("delete", "docs/guide.md", False)]
    questions = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    assert [(q["question"], q["first_seq"]) for q in questions] == [
        ("How do I start?", 0), ("Why is it slow?", 1)]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["provenance"]["since"] == "2024-01-15" and stats["docs"] == 2
    # The benchmarks' own reader takes it, extra fields kept as metadata.
    assert [e.initial for e in read_events(out / "events.jsonl")] == [True, False, False, False]
    assert [q.answer_docs for q in read_questions(out / "questions.jsonl")] == [
        frozenset({"docs/faq.md"})] * 2


def test_the_users_questions_and_clear_errors(repo: Path, tmp_path: Path) -> None:
    mine = tmp_path / "q.jsonl"
    mine.write_text('{"qid": "a", "question": "What runs?", "doc_id": "docs/faq.md"}\n')
    ok = CliRunner().invoke(trace, ["from-git", str(repo), "--out", str(tmp_path / "t"),
                                    "--questions", str(mine), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["questions"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"qid": "a"}\n')
    refused = CliRunner().invoke(trace, ["from-git", str(repo), "--out", str(tmp_path / "u"),
                                         "--questions", str(bad)])
    assert refused.exit_code != 0 and "needs `qid` and `question`" in refused.output
    empty = CliRunner().invoke(trace, ["from-git", str(repo), "--out", str(tmp_path / "v"),
                                       "--include", "*.rst"])
    assert empty.exit_code != 0 and "no document" in empty.output
    not_repo = CliRunner().invoke(trace, ["from-git", str(tmp_path), "--out",
                                          str(tmp_path / "w")])
    assert not_repo.exit_code != 0 and "git rev-parse" in not_repo.output
