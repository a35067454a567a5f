"""Synthetic warmup on the worker, the pure parts: its rate limit, its memory bound, and
turning sampled text into questions. `WorkerRuntime` runs the model; nothing here does."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# Seed 000: batched synthetic requests take under 5% of memory.
MAX_SYNTHETIC_SHARE = 0.05
# `synthesize` commands a worker carries out per minute unless configured otherwise.
DEFAULT_PER_MINUTE = 6.0
# Shorter than this is no question (a lone word, a stray quote); longer is cut.
MIN_QUESTION_CHARS = 8
MAX_QUESTION_CHARS = 300

_NUMBERING = re.compile(r"^\s*(?:[-*•]+|\d+[.)]|q(?:uestion)?\s*\d*\s*[:.)-])\s*", re.IGNORECASE)
_QUOTES = "\"'`“”‘’"


@dataclass
class RateLimit:
    """A token bucket: `per_minute` synthesize commands on average, `burst` at once.

    The seed warns that synthetic requests "may trip rate limits"; a worker bounds what
    it spends on them whatever the app sends. `per_minute` 0 refuses every one.
    """

    per_minute: float
    burst: int = 2
    tokens: float = field(default=-1.0)
    at: float | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = float(self.burst)

    def allow(self, now: float) -> bool:
        """Take one token if there is one at `now` (monotonic seconds)."""
        if self.per_minute <= 0:
            return False
        if self.at is not None:
            refill = max(0.0, now - self.at) * self.per_minute / 60.0
            self.tokens = min(float(self.burst), self.tokens + refill)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def sampling_bytes(prompt_tokens: int, max_new_tokens: int, kv_bytes_per_token: int) -> int:
    """KV one sampled question holds at most: its prompt and every token it may add (the
    samples of a command run one after another, so one sequence's KV at a time)."""
    return (prompt_tokens + max_new_tokens) * kv_bytes_per_token


def within_share(need_bytes: int, mem_total: int, share: float) -> bool:
    """Whether `need_bytes` fits `share` of the worker's KV memory (`mem_total` bytes)."""
    return mem_total > 0 and need_bytes <= share * mem_total


def clean_question(text: str) -> str | None:
    """The question in one sampled completion: its first non-empty line without list
    numbering or quotes, cut after the first question mark; None when nothing usable."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = _NUMBERING.sub("", line).strip().strip(_QUOTES).strip()
    if "?" in line:
        line = line[: line.index("?") + 1]
    line = " ".join(line.split())[:MAX_QUESTION_CHARS]
    if len(line) < MIN_QUESTION_CHARS or not any(c.isalpha() for c in line):
        return None
    return line


def clean_questions(texts: Iterable[str]) -> list[str]:
    """`clean_question` of each completion, duplicates (ignoring case) and unusable dropped."""
    seen: set[str] = set()
    out: list[str] = []
    for text in texts:
        question = clean_question(text)
        if question is not None and question.casefold() not in seen:
            seen.add(question.casefold())
            out.append(question)
    return out


@dataclass
class SynthesisLimits:
    """What a worker allows synthetic warmup: its rate and its share of KV memory; `clock`
    times the rate (monotonic seconds; the strategies benchmark passes its own)."""

    rate: RateLimit
    share: float = MAX_SYNTHETIC_SHARE
    clock: Callable[[], float] = time.monotonic
