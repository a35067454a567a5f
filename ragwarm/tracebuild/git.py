"""Reads a repository's history of matching documents with git's own plumbing."""

from __future__ import annotations

import fnmatch
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragwarm.tracebuild.history import Change, Commit

DEFAULT_INCLUDE = ("*.md", "*.mdx", "*.markdown")


class GitError(RuntimeError):
    """git failed or the path is not a repository; the message says which command."""


@dataclass(frozen=True)
class PathFilter:
    """fnmatch globs on repository paths (`*` crosses `/`): included and not excluded."""

    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = ()

    def __call__(self, path: str) -> bool:
        return (any(fnmatch.fnmatchcase(path, g) for g in self.include)
                and not any(fnmatch.fnmatchcase(path, g) for g in self.exclude))


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                              check=True, text=True, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise GitError("git is not installed (it is needed to read the history)") from None
    except subprocess.CalledProcessError as exc:
        raise GitError(f"git {' '.join(args[:3])} failed in {repo}: "
                       f"{exc.stderr.strip() or exc.returncode}") from None
    return done.stdout


class BlobReader:
    """One `git cat-file --batch` process serving every `rev:path` read of a build."""

    def __init__(self, repo: Path) -> None:
        self._proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def text(self, rev: str, path: str) -> str | None:
        """The file's text at `rev`, or None when it is missing or binary."""
        assert self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(f"{rev}:{path}\n".encode())
        self._proc.stdin.flush()
        header = self._proc.stdout.readline().decode().split()
        if len(header) < 3 or header[1] != "blob":
            return None  # "<rev:path> missing": renamed away or a submodule
        data = self._proc.stdout.read(int(header[2]))
        self._proc.stdout.read(1)  # the newline after each object
        return None if b"\0" in data else data.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        self._proc.wait()

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def base_commit(repo: Path, since: str, ref: str = "HEAD") -> str | None:
    """The last first-parent commit of `ref` before `since`; None when history starts later."""
    out = _git(repo, "rev-list", "-1", "--first-parent", f"--before={since}", ref).strip()
    return out or None


def _snapshot(repo: Path, base: str, keep: PathFilter, blobs: BlobReader) -> Commit:
    paths = [p for p in _git(repo, "ls-tree", "-r", "--name-only", base).splitlines()
             if keep(p)]
    stamp = _git(repo, "show", "-s", "--format=%cI", base).strip()
    changes = tuple(Change(p, t) for p in sorted(paths)
                    if (t := blobs.text(base, p)) is not None)
    return Commit(base, stamp, "(initial snapshot of the base commit)", changes, initial=True)


def _log(repo: Path, base: str | None, ref: str) -> Iterator[tuple[str, str, str, list[str]]]:
    """(sha, timestamp, subject, ["M\tpath", ...]) oldest first along the first parents."""
    span = f"{base}..{ref}" if base else ref
    out = _git(repo, "log", "--first-parent", "--reverse", "--no-renames",
               "--diff-merges=first-parent", "--name-status",
               "--format=%x00%H%x1f%cI%x1f%s", span)
    for block in out.split("\0")[1:]:
        head, _, body = block.partition("\n")
        sha, stamp, subject = head.split("\x1f", 2)
        yield sha, stamp, subject, [line for line in body.splitlines() if line.strip()]


def commits(repo: Path, keep: PathFilter, *, since: str | None = None,
            ref: str = "HEAD") -> Iterator[Commit]:
    """The base snapshot (with `since`) and every later commit touching a kept document."""
    repo = Path(repo)
    _git(repo, "rev-parse", "--git-dir")  # a clear error for a path that is not a repo
    base = base_commit(repo, since, ref) if since else None
    with BlobReader(repo) as blobs:
        if base:
            yield _snapshot(repo, base, keep, blobs)
        for sha, stamp, subject, lines in _log(repo, base, ref):
            changes = tuple(_changes(sha, lines, keep, blobs))
            if changes:
                yield Commit(sha, stamp, subject, changes)


def _changes(sha: str, lines: Sequence[str], keep: PathFilter,
             blobs: BlobReader) -> Iterator[Change]:
    for line in lines:
        status, _, path = line.partition("\t")
        if not keep(path):
            continue
        if status.startswith("D"):
            yield Change(path, None)
        elif (text := blobs.text(sha, path)) is not None:
            yield Change(path, text)
