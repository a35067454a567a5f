"""Prometheus metrics of the streams app, in a registry of its own, read at scrape time.

Most figures already exist (the pipeline's counters, Faust's monitor, the tables); a
collector turns them into metrics when `/metrics` is scraped, so no handler changes to
export them. Only the KB-event-to-warm latency is observed as it happens, by the outbox.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from schemas import WarmupCommand
from streams.decide.records import PrefixOp

CONTENT_TYPE = CONTENT_TYPE_LATEST
# A KB edit is warm again after retrieval, planning and a command: ~10 ms .. minutes.
WARM_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Pipeline counters with a metric of their own: name -> (metric, help).
NAMED_COUNTERS: dict[str, tuple[str, str]] = {
    "kb_events": ("ragwarm_streams_kb_events_total", "KB change events applied."),
    "queries": ("ragwarm_streams_queries_total", "Query events counted."),
    "invalidations": ("ragwarm_streams_invalidations_total", "Prefixes invalidated."),
    "re_prefills": ("ragwarm_streams_re_prefills_total",
                    "Prefixes prefilled again after a KB change."),
    "prefills": ("ragwarm_streams_prefills_total", "Prefill commands planned."),
    "ttl_extensions": ("ragwarm_streams_ttl_extensions_total", "TTL extensions planned."),
    "retries": ("ragwarm_streams_retries_total", "Handler retries after a transient failure."),
    "stale_events": ("ragwarm_streams_stale_events_total",
                     "KB events older than the version held (skipped)."),
    "synthetic_prefixes_warmed": ("ragwarm_streams_synthetic_prefixes_warmed_total",
                                  "Prefixes warmed for questions a worker's model made up."),
    "first_asks": ("ragwarm_streams_first_asks_total",
                   "Queries asking a question for the first time (synthetic warmup on)."),
    "synthetic_first_hits": ("ragwarm_streams_synthetic_first_hits_total",
                             "First asks served whole from a synthetic prefix."),
    "recovery_reseeks": ("ragwarm_streams_recovery_reseeks_total",
                         "Changelog partitions the table-recovery watchdog sought again after "
                         "they got no record while behind (a stalled takeover); alert on any."),
}
PENDING_MAX = 10_000
# Figures kept among the counters that are not counts: a size, a level (parked records);
# and times in milliseconds, exported in seconds by `_timings` (`*_max_ms` the largest seen,
# other `*_ms` sums).
NOT_COUNTERS = frozenset({"kv_bytes_per_token", "parked_records"})
MS = "_ms"
MAX_MS = "_max_ms"


class StreamsMetrics:
    """The registry behind the streams app's `/metrics` and the latency it observes live."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.event_to_warm = Histogram(
            "ragwarm_streams_event_to_warm_seconds",
            "Seconds from a KB change to the prefill command re-warming a prefix it touched.",
            buckets=WARM_BUCKETS, registry=self.registry)
        self.commands = Counter("ragwarm_streams_commands_total",
                                "Warmup commands sent to the workers.", ["op"],
                                registry=self.registry)

    def watch(self, source: Callable[[], Mapping[str, Any]]) -> None:
        """Export the figures `source()` returns at each scrape (see `snapshot`)."""
        self.registry.register(_SnapshotCollector(source))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MeasuredOutbox:
    """An outbox that counts commands and times KB-change-to-prefill.

    A warm op caused by a KB change carries the change's time (`origin_ts`); the prefill
    command it leads to is sent when this instance handles the op. An op handled by another
    instance is not observed there (no sample rather than a wrong one).
    """

    def __init__(self, inner: Any, metrics: StreamsMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.inner, self.metrics, self.clock = inner, metrics, clock
        self.pending: OrderedDict[str, float] = OrderedDict()

    async def op(self, op: PrefixOp) -> None:
        if op.op in ("warm", "warm_on") and op.origin_ts is not None:
            self.pending[op.prefix_hash] = op.origin_ts
            while len(self.pending) > PENDING_MAX:
                self.pending.popitem(last=False)
        await self.inner.op(op)

    async def link(self, link: Any) -> None:
        await self.inner.link(link)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # anything else the outbox offers, unmeasured

    async def command(self, cmd: WarmupCommand) -> None:
        await self.inner.command(cmd)
        self.metrics.commands.labels(op=cmd.op).inc()
        origin = self.pending.pop(cmd.prefix_hash or "", None) if cmd.op == "prefill" else None
        if origin is not None:
            self.metrics.event_to_warm.observe(max(0.0, self.clock() - origin))


def snapshot(stats: Mapping[str, int], tables: Mapping[str, int], hot: int,
             received: Mapping[str, int], sent: Mapping[str, int],
             lag: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    """The figures a scrape exports, as plain values (built by the app, tested alone)."""
    return {"stats": dict(stats), "tables": dict(tables), "hot": hot,
            "received": dict(received), "sent": dict(sent), "lag": dict(lag)}


class _SnapshotCollector:
    def __init__(self, source: Callable[[], Mapping[str, Any]]) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []  # the families are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        yield from families(self.source())


def families(snap: Mapping[str, Any]) -> Iterator[Metric]:
    """The metric families of one snapshot."""
    stats = snap.get("stats") or {}
    for key, (name, doc) in NAMED_COUNTERS.items():
        yield _counter(name, doc, [((), stats.get(key, 0))])
    yield _dead_letters(stats)
    # Counters with a family of their own (and the dead letters) are not repeated here.
    own = NAMED_COUNTERS.keys() | {"dead_letters", "transient_dead_letters"}
    yield _counter("ragwarm_streams_decisions_total",
                   "Pipeline counters without a metric of their own, by name.",
                   [((k,), v) for k, v in sorted(stats.items())
                    if k not in NOT_COUNTERS and k not in own and not k.endswith(MS)],
                   ["name"])
    yield from _timings(stats)
    yield _gauge("ragwarm_streams_parked_records", "Records retried past the retry budget on "
                 "a transient failure (their partition waits); alert while above 0.",
                 [((), stats.get("parked_records", 0))])
    yield _gauge("ragwarm_streams_kv_bytes_per_token", "KV bytes per token the workers report.",
                 [((), stats.get("kv_bytes_per_token", 0))])
    yield _counter("ragwarm_streams_messages_received_total", "Records consumed, by topic.",
                   [((t,), n) for t, n in sorted((snap.get("received") or {}).items())], ["topic"])
    yield _counter("ragwarm_streams_messages_sent_total", "Records produced, by topic.",
                   [((t,), n) for t, n in sorted((snap.get("sent") or {}).items())], ["topic"])
    yield _gauge("ragwarm_streams_table_entries", "Entries in each table.",
                 [((t,), n) for t, n in sorted((snap.get("tables") or {}).items())], ["table"])
    yield _gauge("ragwarm_streams_hot_prefixes", "Prefixes in the hot set.",
                 [((), snap.get("hot", 0))])
    yield _gauge("ragwarm_streams_consumer_lag_records", "Records behind the high watermark.",
                 [((t, str(p)), n) for (t, p), n in sorted((snap.get("lag") or {}).items())],
                 ["topic", "partition"])


Samples = list[tuple[tuple[str, ...], float]]  # (label values, value) of one metric family


def _timings(stats: Mapping[str, int]) -> Iterator[Metric]:
    """The pipeline's millisecond timers, in seconds: sums as a counter (Prometheus takes
    their rate), maxima since start as a gauge; `name` is the timer without `_ms`."""
    sums: Samples = [((k.removesuffix(MS),), v / 1000) for k, v in sorted(stats.items())
                     if k.endswith(MS) and not k.endswith(MAX_MS)]
    maxima: Samples = [((k.removesuffix(MAX_MS),), v / 1000) for k, v in sorted(stats.items())
                       if k.endswith(MAX_MS)]
    yield _counter("ragwarm_streams_time_seconds_total",
                   "Seconds spent or waited, summed, by timer (embed, kb_index, op, ...).",
                   sums, ["name"])
    yield _gauge("ragwarm_streams_time_max_seconds",
                 "The longest single wait or step seen since start, by timer.", maxima, ["name"])


def _dead_letters(stats: Mapping[str, int]) -> Metric:
    """Dead letters by reason class: invalid records, and transient failures (none since
    they are parked, `faults.retry`; kept so dashboards and alerts on it still read 0)."""
    transient = stats.get("transient_dead_letters", 0)
    invalid = max(0, stats.get("dead_letters", 0) - transient)
    return _counter("ragwarm_streams_dead_letters_total", "Records sent to the dead-letter "
                    "topic, by reason.", [(("invalid",), invalid), (("transient",), transient)],
                    ["reason"])


def _counter(name: str, doc: str, samples: list[tuple[tuple[str, ...], float]],
             labels: list[str] | None = None) -> Metric:
    family = CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels or [])
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def _gauge(name: str, doc: str, samples: list[tuple[tuple[str, ...], float]],
           labels: list[str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels or [])
    for values, value in samples:
        family.add_metric(list(values), value)
    return family
