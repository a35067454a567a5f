"""The client's wire-level pieces, pure: route answers, worker order, SSE parsing, errors."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

UP_HINT = "start the local stack with `ragwarm up`, or set RAGWARM_CLIENT_STREAMS_URL"

# --- errors ------------------------------------------------------------------------------
class ClientError(RuntimeError):
    """A query that cannot be answered; the message says why and what to do."""


class StreamsUnavailable(ClientError):
    """The streams app (retrieval and routing) does not answer."""


class NoWorker(ClientError):
    """No ready worker is known to the streams app."""


class WorkerFailed(Exception):
    """One attempt on one worker failed in a way another worker may not (retryable)."""


class RequestRejected(ClientError):
    """A worker refused the request itself (4xx): another worker would refuse it too."""


# --- pure pieces: retrieval results, routes, SSE -------------------------------------------
@dataclass(frozen=True)
class RetrievedChunk:
    """One retrieved chunk, as the streams app's /ragwarm/retrieve returns it."""

    chunk_id: str
    content_hash: str
    doc_id: str
    text: str
    score: float = 0.0
    version: int = 0

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RetrievedChunk:
        return cls(chunk_id=str(raw["chunk_id"]), content_hash=str(raw["content_hash"]),
                   doc_id=str(raw["doc_id"]), text=str(raw["text"]),
                   score=float(raw.get("score") or 0.0), version=int(raw.get("version") or 0))


@dataclass(frozen=True)
class WorkerRef:
    worker_id: str
    url: str


@dataclass(frozen=True)
class Route:
    """The streams app's answer to /ragwarm/route: its choice and every ready worker."""

    chosen: WorkerRef | None
    matched_blocks: int
    workers: tuple[WorkerRef, ...]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Route:
        workers = tuple(WorkerRef(str(w["worker_id"]), str(w["url"]))
                        for w in raw.get("workers") or () if w.get("url"))
        chosen = None
        if raw.get("worker_id") and raw.get("url"):
            chosen = WorkerRef(str(raw["worker_id"]), str(raw["url"]))
        return cls(chosen, int(raw.get("matched_blocks") or 0), workers)


def candidates(route: Route, limit: int) -> list[WorkerRef]:
    """Workers to try in order: the route's choice, then the others as listed, each once."""
    ordered = [route.chosen] if route.chosen else []
    ordered += [w for w in route.workers if route.chosen is None or w.worker_id !=
                route.chosen.worker_id]
    unique: dict[str, WorkerRef] = {}
    for worker in ordered:
        unique.setdefault(worker.worker_id, worker)
    return list(unique.values())[:limit]


def workers_to_try(route: Route, limit: int, streams_url: str) -> list[WorkerRef]:
    """`candidates`, or NoWorker naming the streams app and the fix when there is none."""
    workers = candidates(route, limit)
    if not workers:
        raise NoWorker(f"no ready worker is known to the streams app at {streams_url}; "
                       f"{UP_HINT}")
    return workers


@dataclass
class Failover:
    """What trying workers in turn has seen so far: the sync and async clients' one loop
    bookkeeping (their I/O differs, their rules must not)."""

    failed: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def worker_failed(self, worker: WorkerRef, exc: WorkerFailed) -> None:
        log.warning("worker %s failed (%s); trying the next one", worker.worker_id, exc)
        self.failed.append(worker.worker_id)
        self.reasons.append(f"{worker.worker_id}: {exc}")

    def exhausted(self) -> ClientError:
        return ClientError(f"every worker tried failed: {'; '.join(self.reasons)}")


def status_error(worker: WorkerRef, status: int, message: str) -> Exception | None:
    """How a worker's non-200 answer counts: 5xx and 429 let another worker try
    (WorkerFailed); any other refusal would be the same everywhere (RequestRejected)."""
    if status == 200:
        return None
    if status >= 500 or status == 429:
        return WorkerFailed(f"HTTP {status}: {message}")
    return RequestRejected(f"worker {worker.worker_id} refused the request "
                           f"(HTTP {status}): {message}")


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data of each complete server-sent event; multi-line data is joined with newlines.

    An event is complete at its blank line; an unterminated one at the end is dropped,
    as the SSE specification says.
    """
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            if name == "data":
                data.append(value[1:] if value.startswith(" ") else value)


@dataclass
class StreamResult:
    """What a completion stream delivered so far; `feed` takes one decoded event."""

    sent_at: float
    parts: list[str] = field(default_factory=list)
    first_at: float | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False

    def feed(self, data: str, now: float) -> str:
        """Apply one event's data; returns the new text. Raises WorkerFailed on an error event."""
        if data == "[DONE]":
            self.done = True
            return ""
        try:
            event = json.loads(data)
        except ValueError:
            raise WorkerFailed(f"malformed stream event: {data[:200]!r}") from None
        if not isinstance(event, dict):
            raise WorkerFailed(f"malformed stream event: {data[:200]!r}")
        if "error" in event:
            raise WorkerFailed(f"error in stream: {error_message(event)}")
        if event.get("usage"):
            self.usage = event["usage"]
        text = ""
        for choice in event.get("choices") or ():
            if self.first_at is None:
                self.first_at = now
            text += choice.get("text") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        self.parts.append(text)
        return text

    def check_complete(self) -> None:
        """Raise WorkerFailed unless the stream ended properly (finish reason and [DONE])."""
        if not self.done or self.finish_reason is None or self.first_at is None:
            raise WorkerFailed("the stream ended before the answer was complete")

    @property
    def text(self) -> str:
        return "".join(self.parts)


def error_message(body: Mapping[str, Any]) -> str:
    err = body.get("error")
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)
