"""Thin Faust agents: one per route of `streams/routes.py`, and the guarded timers.

A record that is malformed or invalid is dead-lettered at once; a transient failure is
retried with backoff while its partition waits (per-key order kept) and dead-lettered only
when the retry budget is spent. The handlers (`streams/handlers.py`) hold what the app does.
"""

from __future__ import annotations

import asyncio
import logging

import faust

from schemas import WarmupCommand, encode
from schemas.topics import kb_key
from streams import faults, handlers
from streams.handlers import HandlerDeps
from streams.records import DocLink, PrefixOp
from streams.routes import ROUTES, Route
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
            key=kb_key(link.tenant, link.doc_id), value=link.model_dump_json().encode()
        )

    async def command(self, cmd: WarmupCommand) -> None:
        await self.topics.commands.send(key=(cmd.prefix_hash or "").encode(), value=encode(cmd))


class RecordRunner:
    """Runs one route's handler on each record: decode, wait for the index if needed,
    handle with retries, dead-letter what cannot be handled."""

    def __init__(self, p: HandlerDeps, topics: Topics, route: Route) -> None:
        self.p, self.topics, self.route = p, topics, route
        s = p.settings
        self.backoff = faults.Backoff(s.retry_initial_s, s.retry_max_s, s.retry_attempts)
        self.max_value = faults.value_limit(s.producer_max_request_bytes, s.deadletter_max_bytes)

    async def process(self, event: faust.EventT) -> None:
        msg = event.message
        origin = faults.Origin(msg.topic, msg.partition, msg.offset, msg.key, msg.value)
        try:
            record = self.route.decode(msg.value)
        except Exception as exc:  # noqa: BLE001 - decoding fails the same way every time
            await self.dead_letter(origin, exc, "")
            return
        if self.route.after_index_recovery:
            await self.p.readiness.index.wait()

        def on_retry(exc: BaseException, attempts: int, delay: float) -> None:
            self.p.stats["retries"] += 1
            log.warning(
                "%s[%s]@%s: %s; retrying in %.1f s (up to %d retries)",
                msg.topic, msg.partition, msg.offset, faults.reason_of(exc)[0], delay, attempts,
            )

        handle = self.route.handle
        error = await faults.retry(lambda: handle(self.p, record), self.backoff, on_retry)
        if error is not None:
            if not faults.is_permanent(error):
                self.p.stats["transient_dead_letters"] += 1
                log.error("%s: retries exhausted", self.route.agent, exc_info=error)
            prefix = "" if faults.is_permanent(error) else "transient failure, retries exhausted: "
            await self.dead_letter(origin, error, prefix)

    async def dead_letter(self, origin: faults.Origin, exc: BaseException, prefix: str) -> None:
        """Send the dead letter, retrying until it is sent: the record's offset is committed
        once this returns, so a letter that was never sent would lose it."""
        reason, field = faults.reason_of(exc)
        letter = faults.dead_letter(origin, prefix + reason, field, self.max_value)
        key = (origin.key or b"")[: faults.MAX_REASON] or None
        delay = self.backoff.initial_s
        while True:
            try:
                await self.topics.deadletter.send(key=key, value=encode(letter))
                break
            except Exception:  # noqa: BLE001 - the broker may come back; the partition waits
                log.exception("could not send a dead letter; retrying in %.1f s", delay)
                await asyncio.sleep(delay)
                delay = min(self.backoff.max_s, delay * 2)
        self.p.stats["dead_letters"] += 1
        log.warning(
            "dead letter from %s[%s]@%s: %s", origin.topic, origin.partition, origin.offset, reason
        )


def register_agents(app: faust.App, topics: Topics, p: HandlerDeps) -> None:
    for route in ROUTES:
        _agent(app, getattr(topics, route.topic), RecordRunner(p, topics, route))
    _timers(app, p)


def _agent(app: faust.App, topic: faust.TopicT, runner: RecordRunner) -> None:
    async def agent(stream):
        async for event in stream.events():
            await runner.process(event)

    app.agent(topic, name=runner.route.agent)(agent)


def _timers(app: faust.App, p: HandlerDeps) -> None:
    """Every timer runs guarded: an exception is logged and counted, never stops the app."""

    def count() -> None:
        p.stats["timer_errors"] += 1

    def timer(interval: float, name: str, fn) -> None:
        app.timer(interval, name=name)(faults.guarded(name, fn, count))

    timer(p.settings.hot_tick_s, "ragwarm.hot-tick", lambda: handlers.plan_hot(p))
    timer(p.settings.sweep_s, "ragwarm.prefix-sweep", lambda: _sweep(p))
    timer(p.settings.resend_s, "ragwarm.prefill-resend", lambda: handlers.resend_prefills(p))
    if p.settings.warm_cron:
        name = "ragwarm.scheduled-warmup"
        app.crontab(p.settings.warm_cron)(faults.guarded(name, lambda: _scheduled(p), count))


async def _sweep(p: HandlerDeps) -> None:
    forgotten = await handlers.sweep_prefixes(p)
    if forgotten:
        log.info("sweep: %d expired prefixes to forget", forgotten)


async def _scheduled(p: HandlerDeps) -> None:
    log.info("scheduled warmup of %d hot prefixes", len(p.tracker.hot))
    for op in list(p.tracker.hot.values()):
        await p.out.op(op.model_copy(update={"reason": "scheduled"}))
