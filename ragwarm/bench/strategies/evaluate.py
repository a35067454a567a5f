"""`ragwarm replay rag.queries --from … --evaluate POLICY`: read a range, replay it offline."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from typing import cast

import click
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from tqdm import tqdm

from ragwarm.bench.strategies.offline import evaluate, summary
from ragwarm.bench.strategies.policies import policy_class
from ragwarm.bench.strategies.settings import StrategySettings
from ragwarm.kafka.replay import admin_session, plan_range
from ragwarm.kafka.replay_plan import PartitionPlan, Position, check_range
from ragwarm.settings import KafkaSettings
from schemas import QueryEvent, SchemaError, decode
from workers.settings import WorkerSettings


def read_range(
    consumer: KafkaConsumer, topic: str, plans: Sequence[PartitionPlan], idle_timeout_s: float
) -> Iterator[bytes]:
    """The values of records [start, end) of each partition."""
    todo = {TopicPartition(topic, p.partition): p for p in plans if p.count > 0}
    consumer.assign(list(todo))
    for tp, plan in todo.items():
        consumer.seek(tp, plan.start)
    last = time.monotonic()
    while todo:
        batch = consumer.poll(timeout_ms=500)
        for tp, records in batch.items():
            wanted = todo.get(tp)
            for record in records:
                if wanted is not None and record.offset < wanted.end:
                    yield record.value or b""
        last = time.monotonic() if batch else last
        for tp in [tp for tp, plan in todo.items() if consumer.position(tp) >= plan.end]:
            consumer.pause(tp)
            del todo[tp]
        if todo and time.monotonic() - last > idle_timeout_s:
            raise KafkaError(f"no records from {topic} for {idle_timeout_s:.0f} s")


def load_events(settings: KafkaSettings, topic: str, start: Position,
                end: Position) -> tuple[list[QueryEvent], int]:
    """The query events of the range, and how many records were not query events."""
    with admin_session(settings) as admin:
        plans = plan_range(admin, topic, start, end)
    consumer = KafkaConsumer(bootstrap_servers=settings.servers.split(","),
                             enable_auto_commit=False, **settings.client_options())
    events, rejected = [], 0
    total = sum(p.count for p in plans)
    try:
        bar = tqdm(total=total, desc="read", unit="rec", file=sys.stderr, disable=None)
        with bar:
            for value in read_range(consumer, topic, plans, idle_timeout_s=30.0):
                bar.update(1)
                try:
                    events.append(cast(QueryEvent, decode(value, QueryEvent)))
                except SchemaError:
                    rejected += 1
    except KafkaError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        consumer.close()
    return events, rejected


def run_evaluate(topic: str, start: Position, end: Position, policy: str,
                 as_json: bool) -> None:
    """Print hit rate and estimated TTFT of `policy` on the logged queries of the range."""
    try:
        if policy_class(policy).disk_tier:  # the benchmark's own policies, by the same names
            raise ValueError(f"policy {policy!r} needs the torch engine's disk tier: measure "
                             "it with `ragwarm bench strategies`")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--evaluate") from None
    try:
        check_range(start, end)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    events, rejected = load_events(KafkaSettings(), topic, start, end)
    worker = WorkerSettings()
    kv_bytes = worker.kv_bytes
    outcomes, cost, _ = evaluate(events, policy, StrategySettings(), kv_bytes,
                                 block_size=worker.block_size, eviction=worker.eviction_policy)
    report = {"topic": topic, "from": str(start), "to": str(end), "policy": policy,
              "kv_bytes": kv_bytes, "rejected": rejected} | summary(outcomes, cost)
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(_text(report))


def _text(r: dict) -> str:
    cost = r["cost_model"]
    basis = (f"fitted on {cost['fitted_on']} logged TTFTs" if cost["fitted_on"]
             else "default figures (the log has no usable TTFTs)")
    lines = [
        f"{r['queries']} query events of {r['topic']} [{r['from']}, {r['to']}) "
        f"({r['rejected']} other records skipped), policy {r['policy']}, "
        f"KV budget {r['kv_bytes'] / 2**20:.0f} MiB",
        f"hit rate {_rate(r['hit_rate'])}, cached prompt tokens {_rate(r['cached_token_share'])}",
        f"estimated TTFT p50 {r['est_ttft_p50_ms']} ms, p90 {r['est_ttft_p90_ms']} ms, "
        f"p99 {r['est_ttft_p99_ms']} ms (logged: p50 {r['logged_ttft_p50_ms']} ms, "
        f"p90 {r['logged_ttft_p90_ms']} ms, p99 {r['logged_ttft_p99_ms']} ms)",
        f"estimate: {cost['fixed_ms']} ms + {cost['per_token_ms']} ms per uncached prompt "
        f"token, {basis}",
    ]
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "n/a (no queries)" if value is None else f"{value:.1%}"
