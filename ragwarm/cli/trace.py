"""`ragwarm trace from-git`: a replayable KB trace from a documentation repository's history."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from ragwarm.tracebuild.git import DEFAULT_INCLUDE, GitError, PathFilter, commits
from ragwarm.tracebuild.history import History, jsonl


@click.group()
def trace() -> None:
    """Build replayable KB traces (the shared trace format) from your own knowledge base."""


@trace.command("from-git")
@click.argument("repo", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Folder for events.jsonl, questions.jsonl and stats.json.")
@click.option("--include", multiple=True, metavar="GLOB",
              help=f"Documents to keep (fnmatch on the repository path, `*` crosses `/`; "
                   f"repeatable; default {' '.join(DEFAULT_INCLUDE)}).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Documents to leave out.")
@click.option("--since", metavar="DATE",
              help="Start here: the documents as they stood before DATE become the initial "
                   "upserts, and every later commit is an edit (default: the whole history).")
@click.option("--ref", default="HEAD", show_default=True, help="The history to read.")
@click.option("--questions", "questions", default="headings", show_default=True,
              metavar="headings|FILE",
              help="Questions from headings phrased as questions, or a JSONL file of yours "
                   "(qid, question; optional doc_id, first_seq, removed_seq).")
@click.option("--max-chars", default=20_000, show_default=True,
              help="Trim each document version to this many characters.")
@click.option("--json", "as_json", is_flag=True, help="Print the stats as one JSON object.")
def from_git(repo: Path, out_dir: Path, include: tuple[str, ...], exclude: tuple[str, ...],
             since: str | None, ref: str, questions: str, max_chars: int,
             as_json: bool) -> None:
    """A trace from REPO's git history: each commit touching a document is a KB change
    carrying that version's real text.

    Run `ragwarm bench strategies --events OUT/events.jsonl --questions OUT/questions.jsonl`
    on it to measure the warmup policies on your own knowledge base.
    """
    own_questions = None if questions == "headings" else _read_questions(Path(questions))
    keep = PathFilter(include or DEFAULT_INCLUDE, exclude)
    history = History(max_chars=max_chars, ask_headings=own_questions is None)
    started, n = time.monotonic(), 0
    try:
        for n, commit in enumerate(commits(repo, keep, since=since, ref=ref), start=1):
            history.add(commit)
            if n % 200 == 0:
                click.echo(f"  {n} commits, {len(history.events)} events "
                           f"({time.monotonic() - started:.0f} s)", err=True)
    except GitError as exc:
        raise click.ClickException(str(exc)) from None
    if not history.events:
        raise click.ClickException(
            f"no document of {repo} matches --include {' '.join(keep.include)}"
            + (f" after {since}" if since else "") + ": nothing to write")
    stats = _write(out_dir, history, own_questions, {
        "repo": str(repo.resolve()), "ref": ref, "include": list(keep.include),
        "exclude": list(keep.exclude), "since": since, "questions": questions,
        "max_chars": max_chars, "command": " ".join(["ragwarm", "trace", *sys.argv[2:]]),
        "built": datetime.now(UTC).isoformat(timespec="seconds")})
    if as_json:
        click.echo(json.dumps(stats))
        return
    click.echo(f"{out_dir}: {stats['events']} events over {stats['docs']} documents "
               f"({stats['initial_upserts']} initial, {stats['upserts']} edits, "
               f"{stats['deletes']} deletes), {stats['questions']} questions "
               f"({stats['questions_live_at_end']} live at the end)")
    if stats["questions"] == 0:
        click.echo("warning: no questions: the documents have no headings ending in '?'; "
                   "give --questions FILE", err=True)


def _read_questions(path: Path) -> list[dict]:
    """The user's questions, checked for the fields every benchmark needs."""
    if not path.is_file():
        raise click.BadParameter(f"{path} is neither `headings` nor a file",
                                 param_hint="--questions")
    out = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{path}:{line_no}: not JSON ({exc.msg})",
                                     param_hint="--questions") from None
        if not isinstance(record, dict) or not record.get("qid") or not record.get("question"):
            raise click.BadParameter(f"{path}:{line_no}: needs `qid` and `question`",
                                     param_hint="--questions")
        out.append(record)
    return out


def _write(out_dir: Path, history: History, own_questions: list[dict] | None,
           provenance: dict) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    questions = history.questions if own_questions is None else own_questions
    (out_dir / "events.jsonl").write_text("".join(jsonl(history.events)), encoding="utf-8")
    (out_dir / "questions.jsonl").write_text("".join(jsonl(questions)), encoding="utf-8")
    stats = {**history.stats(), "questions": len(questions),
             "questions_live_at_end": sum(1 for q in questions
                                          if q.get("live_at_end", q.get("removed_seq") is None)),
             "provenance": provenance}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats
