"""Thin Faust agents: decode a record, run its handler, dead-letter what fails.

The handlers (`streams/handlers.py`) hold what the app does; this module only connects
them to topics, changelog tables and timers.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable

import faust
from pydantic import ValidationError

from schemas import (
    DeadLetter,
    KbChange,
    QueryEvent,
    SchemaError,
    WarmupCommand,
    WorkerEvent,
    decode,
    encode,
)
from streams import handlers as h
from streams.handlers import Pipeline
from streams.records import DocLink, PrefixOp
from streams.topics import Topics

log = logging.getLogger(__name__)


class KafkaOutbox:
    """The handlers' outbox on the app's topics, keyed so each table keeps its partition."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics

    async def op(self, op: PrefixOp) -> None:
        await self.topics.prefix_ops.send(
            key=op.prefix_hash.encode(), value=op.model_dump_json().encode()
        )

    async def link(self, link: DocLink) -> None:
        await self.topics.doc_links.send(
            key=link.doc_id.encode(), value=link.model_dump_json().encode()
        )

    async def command(self, cmd: WarmupCommand) -> None:
        await self.topics.commands.send(key=(cmd.prefix_hash or "").encode(), value=encode(cmd))


async def dead_letter(
    p: Pipeline, topics: Topics, event: faust.EventT, reason: str, field_name: str | None
) -> None:
    msg = event.message
    letter = DeadLetter(
        source_topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        key_b64=base64.b64encode(msg.key).decode() if msg.key else None,
        value_b64=base64.b64encode(msg.value or b"").decode(),
        reason=reason[:4096],
        error_field=field_name,
    )
    await topics.deadletter.send(key=msg.key, value=encode(letter))
    p.stats["dead_letters"] += 1
    log.warning("dead letter from %s[%s]@%s: %s", msg.topic, msg.partition, msg.offset, reason)


def register_agents(app: faust.App, topics: Topics, p: Pipeline) -> None:
    async def guarded(event: faust.EventT, handle: Callable[[], Awaitable[None]]) -> None:
        """Run one record's handler; a failure dead-letters the record, not the agent."""
        try:
            await handle()
        except SchemaError as exc:
            await dead_letter(p, topics, event, str(exc), exc.field)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(map(str, err["loc"])) or None
            await dead_letter(p, topics, event, f"invalid record: {err['msg']}", loc)
        except Exception as exc:  # noqa: BLE001 - one bad record must not stop the agent
            log.exception("processing failed")
            reason = f"processing failed: {type(exc).__name__}: {exc}"
            await dead_letter(p, topics, event, reason, None)

    @app.agent(topics.kb_changes, name="ragwarm.kb-changes")
    async def kb_changes(stream):
        async for event in stream.events():
            await guarded(event, lambda e=event: h.on_kb_change(p, decode(e.value, KbChange)))

    @app.agent(topics.prefix_ops, name="ragwarm.prefix-ops")
    async def prefix_ops(stream):
        async for event in stream.events():
            await guarded(
                event, lambda e=event: h.on_prefix_op(p, PrefixOp.model_validate_json(e.value))
            )

    @app.agent(topics.doc_links, name="ragwarm.doc-links")
    async def doc_links(stream):
        async for event in stream.events():
            await guarded(
                event, lambda e=event: h.on_doc_link(p, DocLink.model_validate_json(e.value))
            )

    @app.agent(topics.worker_events, name="ragwarm.worker-events")
    async def worker_events(stream):
        async for event in stream.events():
            await guarded(event, lambda e=event: h.on_worker_event(p, decode(e.value, WorkerEvent)))

    @app.agent(topics.queries, name="ragwarm.token-frequency")
    async def queries(stream):
        async for event in stream.events():
            await guarded(event, lambda e=event: h.on_query(p, decode(e.value, QueryEvent)))

    @app.timer(p.settings.hot_tick_s, name="ragwarm.hot-tick")
    async def hot_tick():
        await h.plan_hot(p)

    @app.timer(p.settings.sweep_s, name="ragwarm.prefix-sweep")
    async def prefix_sweep():
        forgotten = await h.sweep_prefixes(p)
        if forgotten:
            log.info("sweep: %d expired prefixes to forget", forgotten)

    if p.settings.warm_cron:

        @app.crontab(p.settings.warm_cron, name="ragwarm.scheduled-warmup")
        async def scheduled_warmup():
            log.info("scheduled warmup of %d hot prefixes", len(p.tracker.hot))
            for op in list(p.tracker.hot.values()):
                await p.out.op(op.model_copy(update={"reason": "scheduled"}))
