"""Thin Faust agents: one per route of `streams/shell/routes.py`, and the guarded timers.

A record that is malformed or invalid is dead-lettered at once; a transient failure is
retried with backoff while its partition waits (per-key order kept), and past the retry
budget parked: retried for good, with the `parked_records` gauge up (`faults.retry` says
why it is never dead-lettered). The handlers (`streams/handle/handlers.py`) hold what the app does.
"""

from __future__ import annotations

import asyncio
import logging
import time

import faust
from pydantic import SecretStr

from schemas import KbChange, QueryEvent, WarmupCommand, deadletter, encode
from schemas.signing import COMMAND_SIGNATURE_HEADER, command_signature, derive_commands_key
from schemas.topics import kb_key
from streams.decide import priority
from streams.decide.records import DocLink, PrefixOp, ReadyRewarm
from streams.handle import catchup, handlers, synthesize
from streams.handle.handlers import HandlerDeps
from streams.shell import faults
from streams.shell.routes import ROUTES, Route
from streams.shell.tables import writing_to
from streams.shell.topics import Topics

log = logging.getLogger(__name__)


class KafkaOutbox:
    """The handlers' outbox on the app's topics, keyed so each table keeps its partition.
    With the signing secret (`worker_events_secret`), each command carries its signature
    in a record header, which the workers given `derive_commands_key` of it verify."""

    def __init__(self, topics: Topics, partitions: int, secret: SecretStr | None = None) -> None:
        self.topics = topics
        self.partitions = partitions
        self.commands_key = (
            derive_commands_key(secret.get_secret_value().encode()).encode() if secret else None
        )

    async def op(self, op: PrefixOp) -> None:
        await self.topics.prefix_ops.send(
            key=op.prefix_hash.encode(), value=op.model_dump_json().encode()
        )

    async def link(self, link: DocLink) -> None:
        await self.topics.doc_links.send(
            key=kb_key(link.tenant, link.doc_id), value=link.model_dump_json().encode()
        )

    async def command(self, cmd: WarmupCommand) -> None:
        value = encode(cmd)
        headers = []
        if self.commands_key is not None:
            headers = [(COMMAND_SIGNATURE_HEADER, command_signature(value, self.commands_key))]
        await self.topics.commands.send(
            key=(cmd.prefix_hash or "").encode(), value=value, headers=headers
        )

    async def ready(self, req: ReadyRewarm) -> None:
        n = self.partitions
        for k in range(n):
            one = req.model_copy(update={"partition": k, "partitions": n})
            await self.topics.worker_ready.send(value=one.model_dump_json().encode(), partition=k)


class RecordRunner:
    """Runs one route's handler on each record: decode, wait for the index if needed,
    handle with retries, dead-letter what cannot be handled."""

    def __init__(self, p: HandlerDeps, topics: Topics, route: Route) -> None:
        self.p, self.topics, self.route = p, topics, route
        s = p.settings
        self.backoff = faults.Backoff(s.retry_initial_s, s.retry_max_s, s.retry_attempts)
        self.max_value = deadletter.value_limit(
            s.producer_max_request_bytes, s.deadletter_max_bytes
        )

    async def process(self, event: faust.EventT) -> None:
        record = await self.decode(event)
        if record is None:
            return
        if self.route.after_index_recovery:
            await self.p.readiness.index.wait()
        await self.run(event, lambda: self.route.handle(self.p, record))

    async def decode(self, event: faust.EventT):
        """The event's record; None once a record that cannot be decoded is dead-lettered."""
        try:
            return self.route.decode(event.message.value)
        except Exception as exc:  # noqa: BLE001 - decoding fails the same way every time
            await self.dead_letter(_origin(event), exc, "")
            return None

    async def run(self, event: faust.EventT, handle) -> None:
        """`handle()` with retries; dead-letter `event` when it cannot be handled."""
        msg = event.message

        def on_retry(exc: BaseException, attempts: int, delay: float) -> None:
            self.p.stats["retries"] += 1
            log.warning(
                "%s[%s]@%s: %s; retrying in %.1f s (up to %d retries)",
                msg.topic, msg.partition, msg.offset, faults.reason_of(exc)[0], delay, attempts,
            )

        error = await faults.retry(handle, self.backoff, on_retry, on_park=self.parked)
        if error is not None:  # permanent: a transient failure is retried until it passes
            await self.dead_letter(_origin(event), error, "")

    def on_flush_retry(self, exc: BaseException, attempts: int, delay: float) -> None:
        self.p.stats["retries"] += 1
        log.warning("%s: writing the windows: %s; retrying in %.1f s", self.route.agent,
                    faults.reason_of(exc)[0], delay)

    def parked(self, change: int) -> None:
        """Count records parked on a transient failure (a gauge: an alert while above 0)."""
        self.p.stats["parked_records"] += change
        if change > 0:
            self.p.stats["parked"] += 1
            log.error("%s: a record is parked on a transient failure; retried every %.0f s "
                      "until it passes", self.route.agent, self.backoff.max_s)

    async def dead_letter(self, origin: deadletter.Origin, exc: BaseException, prefix: str) -> None:
        """Send the dead letter, retrying until it is sent: the record's offset is committed
        once this returns, so a letter that was never sent would lose it."""
        reason, field = faults.reason_of(exc)
        letter = deadletter.dead_letter(origin, prefix + reason, field, self.max_value)
        key = deadletter.letter_key(origin)
        # The broker may come back; the partition waits meanwhile.
        await faults.retry_until_done(
            lambda: self.topics.deadletter.send(key=key, value=encode(letter)), self.backoff,
            lambda _exc, delay: log.exception("could not send a dead letter; retrying in "
                                              "%.1f s", delay))
        self.p.stats["dead_letters"] += 1
        log.warning(
            "dead letter from %s[%s]@%s: %s", origin.topic, origin.partition, origin.offset, reason
        )


class KbBatchRunner:
    """KB changes in batches: index them together (retried as one), then record each with
    its table writes sent to the changelog partition of its own record, as Faust does one
    record at a time. A batch that cannot be indexed
    falls back to one record at a time (so only a bad record is dead-lettered)."""

    def __init__(self, one: RecordRunner) -> None:
        self.one, self.p = one, one.p

    async def process(self, events: list[faust.EventT]) -> None:
        start = time.perf_counter()
        await self._process(events)
        # With `kb_index_ms` and `embed_ms`: where the time of indexing goes.
        self.p.stats["kb_batch_ms"] += round((time.perf_counter() - start) * 1000)

    async def _process(self, events: list[faust.EventT]) -> None:
        decoded: list[tuple[faust.EventT, KbChange]] = []  # what the KB route decodes
        for event in events:
            try:
                decoded.append((event, self.one.route.decode(event.message.value)))
            except Exception:  # noqa: BLE001 - the single runner dead-letters it
                with writing_to(event.message.partition):
                    await self.one.process(event)
        if not decoded:
            return
        await self.p.readiness.index.wait()
        changes = [change for _, change in decoded]
        results: list = []

        async def index() -> None:
            start = time.perf_counter()
            results[:] = await handlers.index_batch(self.p, changes)
            self.p.stats["kb_index_ms"] += round((time.perf_counter() - start) * 1000)

        error = await faults.retry(index, self.one.backoff, self._on_retry,
                                   on_park=self.one.parked)
        if error is not None:  # permanent: find the bad record one at a time
            self.p.stats["kb_batch_fallbacks"] += 1
            for event, _ in decoded:
                with writing_to(event.message.partition):
                    await self.one.process(event)
            return
        self.p.stats["kb_batches"] += 1
        for (event, change), chunks in zip(decoded, results, strict=True):
            with writing_to(event.message.partition):
                await self.one.run(event, lambda c=change, n=chunks: self._apply(c, n))

    async def _apply(self, change, chunks) -> None:
        await handlers.apply_indexed(self.p, change, chunks)

    def _on_retry(self, exc: BaseException, attempts: int, delay: float) -> None:
        self.p.stats["retries"] += 1
        log.warning("KB batch: %s; retrying in %.1f s", faults.reason_of(exc)[0], delay)


def _origin(event: faust.EventT) -> deadletter.Origin:
    msg = event.message
    return deadletter.Origin(msg.topic, msg.partition, msg.offset, msg.key, msg.value)


def partition_of(key: str, partitions: int) -> int:
    """The partition the producer's default partitioner gives `key` (murmur2, as Kafka's)."""
    from aiokafka.partitioner import murmur2

    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def register_agents(app: faust.App, topics: Topics, p: HandlerDeps) -> None:
    for route in ROUTES:
        runner = RecordRunner(p, topics, route)
        if route.record is KbChange:
            _batch_agent(app, getattr(topics, route.topic), KbBatchRunner(runner))
        elif route.record is QueryEvent:
            _query_agent(app, getattr(topics, route.topic), runner)
        elif route.record is PrefixOp:
            _op_agent(app, getattr(topics, route.topic), runner)
        else:
            _agent(app, getattr(topics, route.topic), runner)
    _timers(app, p)


def _batch_agent(app: faust.App, topic: faust.TopicT, runner: KbBatchRunner) -> None:
    s = runner.p.settings

    async def agent(stream):
        async for events in stream.take_events(s.kb_batch_max, within=s.kb_batch_within_s):
            for event in events:
                _count_lag(runner.p, "kb", event)
            await runner.process(list(events))

    app.agent(topic, name=runner.one.route.agent)(agent)


def _query_agent(app: faust.App, topic: faust.TopicT, runner: RecordRunner) -> None:
    s = runner.p.settings

    async def agent(stream):
        async for events in stream.take_events(s.query_batch_max, within=s.query_batch_within_s):
            await handle_queries(runner, events)

    app.agent(topic, name=runner.route.agent)(agent)


async def handle_queries(runner: RecordRunner, events: list[faust.EventT]) -> None:
    """Queries counted one by one, their hot-token windows written once per batch (a
    changelog record per query would cost more than counting it). Counting goes through
    the retrying runner only when it fails, and a query whose prefix is due a warm op
    sends it through it: at thousands of queries a second the per-record wrapper was a
    tenth of the agent's time (issue 14). The windows' write is retried (parked past the
    budget) like a record: outside any runner, one failure lost the batch's counts."""
    p = runner.p
    for event in events:
        query = await runner.decode(event)
        if query is None:
            continue
        try:
            due = handlers.count_query(p, query)
        except Exception:  # noqa: BLE001 - rare; the runner retries it or dead-letters it
            due = await _count_retried(runner, event, query)
        if due:
            await runner.run(event, lambda q=query: handlers.send_query_op(p, q))

    async def flush() -> None:
        p.tracker.flush(p.clock())

    error = await faults.retry(flush, runner.backoff, runner.on_flush_retry,
                               on_park=runner.parked)
    if error is not None:  # not a record's fault: nothing to dead-letter; counted, kept
        p.stats["flush_errors"] += 1
        log.error("token-frequency windows could not be written", exc_info=error)


async def _count_retried(runner: RecordRunner, event: faust.EventT, query: QueryEvent) -> bool:
    """`count_query` under the runner (after it failed once): whether the query is due."""
    counted: list[bool] = []

    async def count() -> None:
        counted[:] = [handlers.count_query(runner.p, query)]

    await runner.run(event, count)
    return bool(counted and counted[0])


def _op_agent(app: faust.App, topic: faust.TopicT, runner: RecordRunner) -> None:
    """Prefix ops one by one, in small batches: the index replica catches up once per batch
    (`streams.handle.catchup`), every op of it having been fetched before the batch is handed over.
    One broker round trip per op capped this agent at a few ops a second."""
    s = runner.p.settings

    async def agent(stream):
        async for events in stream.take_events(s.op_batch_max, within=s.op_batch_within_s):
            with catchup.inputs_from(time.monotonic()):
                for event in events:
                    _count_lag(runner.p, "op", event)
                    # Outside Faust's per-event iteration: say which changelog partition
                    # the prefixes table writes go to (that of the op's own record).
                    with writing_to(event.message.partition):
                        start = time.perf_counter()
                        await runner.process(event)
                        runner.p.stats["op_ms"] += round((time.perf_counter() - start) * 1000)
                        runner.p.stats["ops_handled"] += 1

    app.agent(topic, name=runner.route.agent)(agent)


def _count_lag(p: HandlerDeps, name: str, event: faust.EventT) -> None:
    """How long records waited from being produced to being handled (`<name>_lag_ms`, the
    sum, and its maximum): the internal topics' round trips in an edit's way to warm."""
    stamp = event.message.timestamp  # seconds, the producer's clock (this host's)
    if not stamp:
        return
    lag = max(0, round((time.time() - stamp) * 1000))
    p.stats[f"{name}_lag_ms"] += lag
    p.stats[f"{name}_lag_max_ms"] = max(p.stats[f"{name}_lag_max_ms"], lag)


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

    app.task(lambda: _watch_loop(p))
    timer(p.settings.hot_tick_s, "ragwarm.hot-tick", lambda: _hot_tick(p))
    timer(p.settings.sweep_s, "ragwarm.prefix-sweep", lambda: _sweep(p))
    timer(p.settings.resend_s, "ragwarm.prefill-resend", lambda: handlers.resend_prefills(p))
    if p.settings.synthetic:
        timer(p.settings.hot_tick_s, "ragwarm.synthetic-tick", lambda: synthesize.tick(p))
    if p.settings.warm_cron:
        name = "ragwarm.scheduled-warmup"
        app.crontab(p.settings.warm_cron)(faults.guarded(name, lambda: _scheduled(p), count))


LOOP_PROBE_S = 0.05
LOOP_STALL_MS = 100
LOOP_WARN_MS = 500


async def _watch_loop(p: HandlerDeps) -> None:
    """Count how late the event loop wakes a sleeper (`loop_lag_max_ms`, `loop_stalls` over
    100 ms): every agent and timer shares the loop, so code that holds it delays them all."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(LOOP_PROBE_S)
        late = round((time.perf_counter() - start - LOOP_PROBE_S) * 1000)
        p.stats["loop_lag_max_ms"] = max(p.stats["loop_lag_max_ms"], late)
        if late > LOOP_STALL_MS:
            p.stats["loop_stalls"] += 1
            p.stats["loop_stall_ms"] += late
        if late > LOOP_WARN_MS:
            log.warning("event loop held for %d ms (every agent and timer waited)", late)


async def _hot_tick(p: HandlerDeps) -> None:
    start = time.perf_counter()
    try:
        # Its retrievals wait for those of edits and ops queued meanwhile (`decide.priority`).
        with priority.background():
            await _plan_tick(p)
    finally:
        ms = round((time.perf_counter() - start) * 1000)
        p.stats["hot_tick_ms"] += ms
        p.stats["hot_tick_max_ms"] = max(p.stats["hot_tick_max_ms"], ms)


async def _plan_tick(p: HandlerDeps) -> None:
    # A tick plans from the windows and tables as it starts: one replica catch-up serves
    # all its hot prefixes (it overlapped the next tick under load when each caught up).
    with catchup.inputs_from(time.monotonic()):
        await handlers.plan_hot(p)


async def _sweep(p: HandlerDeps) -> None:
    forgotten = await handlers.sweep_prefixes(p)
    if forgotten:
        log.info("sweep: %d expired prefixes to forget", forgotten)


async def _scheduled(p: HandlerDeps) -> None:
    log.info("scheduled warmup of %d hot prefixes", len(p.tracker.hot))
    for op in list(p.tracker.hot.values()):
        await p.out.op(op.model_copy(update={"reason": "scheduled"}))
