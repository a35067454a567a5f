"""One table from record type to its topic, decoder and handler: the app's only dispatch.

The Faust agents (`streams/shell/agents.py`) make one agent per route; the strategies
simulation feeds its in-process queue through `route_for`, so both run the same handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from schemas import KbChange, QueryEvent, SchemaError, WorkerEvent, decode
from streams.decide.records import DocLink, PrefixOp, ReadyRewarm
from streams.handle import handlers

# `async def` handlers: the strategies simulation steps their coroutines itself.
Handler = Callable[[handlers.HandlerDeps, Any], Coroutine[Any, Any, None]]
# A record's value as Kafka hands it over: None for a tombstone.
Decoder = Callable[[bytes | None], Any]


@dataclass(frozen=True)
class Route:
    """Records of `record` arrive on `topic` (a `streams.shell.topics.Topics` field), are read by
    `decode` and handled by `handle`; `after_index_recovery`: wait until the app's index
    is consistent with its tables (a KB change must not race the re-indexing)."""

    record: type
    topic: str
    agent: str
    decode: Decoder
    handle: Handler
    after_index_recovery: bool = False


def _event(model: type) -> Decoder:
    return lambda raw: decode(_value(raw), model)


def _record(model: Any) -> Decoder:
    return lambda raw: model.model_validate_json(_value(raw))


def _value(raw: bytes | None) -> bytes:
    """A tombstone is bad input here (even on the compacted kb.changes a delete is a record),
    dead-lettered as such."""
    if raw is None:
        raise SchemaError("", "no value (a tombstone): every record here holds one")
    return raw


ROUTES: tuple[Route, ...] = (
    Route(
        KbChange, "kb_changes", "ragwarm.kb-changes", _event(KbChange), handlers.on_kb_change,
        after_index_recovery=True,
    ),
    Route(PrefixOp, "prefix_ops", "ragwarm.prefix-ops", _record(PrefixOp), handlers.on_prefix_op),
    Route(DocLink, "doc_links", "ragwarm.doc-links", _record(DocLink), handlers.on_doc_link),
    Route(
        WorkerEvent, "worker_events", "ragwarm.worker-events", _event(WorkerEvent),
        handlers.on_worker_event,
    ),
    Route(QueryEvent, "queries", "ragwarm.token-frequency", _event(QueryEvent), handlers.on_query),
    Route(
        ReadyRewarm, "worker_ready", "ragwarm.worker-ready", _record(ReadyRewarm),
        handlers.on_ready_rewarm,
    ),
)

BY_TYPE: dict[type, Route] = {r.record: r for r in ROUTES}


def route_for(item: object) -> Route:
    """The route of an already decoded record (the simulation's in-process topics)."""
    try:
        return BY_TYPE[type(item)]
    except KeyError:
        known = ", ".join(t.__name__ for t in BY_TYPE)
        raise TypeError(f"no route for {type(item).__name__}; known: {known}") from None
