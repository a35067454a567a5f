"""Questions a Markdown document asks of itself: its headings phrased as questions."""

from __future__ import annotations

import re
from dataclasses import dataclass

# ATX headings only ("## Why ...?"); setext headings are rare in documentation repos and
# ambiguous with tables and front matter rules.
_ATX = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^[ \t]{0,3}(```|~~~)")
# Links, inline code marks and emphasis are kept as their text: the question a user types.
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MARKS = re.compile(r"[`*_]+")
_ANCHOR = re.compile(r"\s*\{#[^}]*\}\s*$")


@dataclass(frozen=True)
class HeadingQuestion:
    """A heading ending in "?" and the section under it, up to the next heading at its level."""

    question: str
    level: int
    answer: str


def clean_heading(raw: str) -> str:
    """The heading as plain text: no link targets, code marks, emphasis or `{#anchor}`."""
    text = _ANCHOR.sub("", raw)
    text = _LINK.sub(r"\1", text)
    text = _MARKS.sub("", text)
    return " ".join(text.split())


def _headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, text) of every ATX heading outside fenced code."""
    out, fenced = [], False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _ATX.match(line)
        if match:
            out.append((i, len(match.group(1)), clean_heading(match.group(2))))
    return out


def question_headings(text: str) -> list[HeadingQuestion]:
    """Every heading of `text` phrased as a question, in document order, first of each text."""
    lines = text.splitlines()
    heads = _headings(lines)
    found: dict[str, HeadingQuestion] = {}
    for n, (i, level, title) in enumerate(heads):
        if not title.endswith("?") or len(title) < 8 or title in found:
            continue
        end = next((j for j, lv, _ in heads[n + 1:] if lv <= level), len(lines))
        answer = "\n".join(lines[i + 1:end]).strip()
        found[title] = HeadingQuestion(title, level, answer)
    return list(found.values())
