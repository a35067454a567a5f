"""The streams app's metrics: families from a snapshot, and KB-event-to-warm timing."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from schemas import WarmupCommand
from streams.decide.records import PrefixOp
from streams.shell.metrics import MeasuredOutbox, StreamsMetrics, snapshot

P0, P1 = "0" * 16, "1" * 16


class ListOutbox:
    def __init__(self) -> None:
        self.sent: list = []

    async def op(self, op) -> None:
        self.sent.append(op)

    async def link(self, link) -> None:
        self.sent.append(link)

    async def command(self, cmd) -> None:
        self.sent.append(cmd)


def samples(metrics: StreamsMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_scrape_exports_counters_tables_topics_and_lag() -> None:
    metrics = StreamsMetrics()
    metrics.watch(lambda: snapshot(
        {"kb_events": 3, "invalidations": 2, "re_prefills": 1, "dead_letters": 5,
         "transient_dead_letters": 1, "retries": 4, "ttl_extensions": 7},
        {"docs": 3, "prefixes": 9}, 2, {"kb.changes": 3}, {"warmup.commands": 6},
        {("kb.changes", 0): 0, ("rag.queries", 1): 12}))
    got = samples(metrics)
    assert got[("ragwarm_streams_kb_events_total", ())] == 3
    assert got[("ragwarm_streams_re_prefills_total", ())] == 1
    assert got[("ragwarm_streams_ttl_extensions_total", ())] == 7
    assert got[("ragwarm_streams_retries_total", ())] == 4
    assert got[("ragwarm_streams_dead_letters_total", (("reason", "invalid"),))] == 4
    assert got[("ragwarm_streams_dead_letters_total", (("reason", "transient"),))] == 1
    assert got[("ragwarm_streams_messages_received_total", (("topic", "kb.changes"),))] == 3
    assert got[("ragwarm_streams_messages_sent_total", (("topic", "warmup.commands"),))] == 6
    assert got[("ragwarm_streams_table_entries", (("table", "prefixes"),))] == 9
    assert got[("ragwarm_streams_hot_prefixes", ())] == 2
    lag = (("partition", "1"), ("topic", "rag.queries"))
    assert got[("ragwarm_streams_consumer_lag_records", lag)] == 12


def test_millisecond_timers_are_exported_in_seconds_not_as_decisions() -> None:
    metrics = StreamsMetrics()
    metrics.watch(lambda: snapshot(
        {"embed_ms": 1500, "op_lag_ms": 30, "op_lag_max_ms": 20, "kb_events": 2,
         "first_asks": 1, "stale_hits": 4, "kv_bytes_per_token": 64},
        {}, 0, {}, {}, {}))
    got = samples(metrics)
    assert got[("ragwarm_streams_time_seconds_total", (("name", "embed"),))] == 1.5
    assert got[("ragwarm_streams_time_seconds_total", (("name", "op_lag"),))] == 0.03
    assert got[("ragwarm_streams_time_max_seconds", (("name", "op_lag"),))] == 0.02
    decisions = {labels: v for (name, labels), v in got.items()
                 if name == "ragwarm_streams_decisions_total"}
    # Only the counters without a family of their own; no time, no size.
    assert decisions == {(("name", "stale_hits"),): 4}
    assert got[("ragwarm_streams_kb_events_total", ())] == 2
    assert got[("ragwarm_streams_kv_bytes_per_token", ())] == 64


async def test_kb_event_to_prefill_is_timed_and_commands_counted() -> None:
    metrics, now = StreamsMetrics(), [100.0]
    out = MeasuredOutbox(ListOutbox(), metrics, clock=lambda: now[0])
    await out.op(PrefixOp(op="warm", prefix_hash=P1, tenant="t", origin_ts=98.5,
                          reason="re-prefill after x"))
    await out.command(WarmupCommand(command_id="c", op="invalidate", prefix_hash=P0, tenant="t"))
    now[0] = 101.0
    await out.command(WarmupCommand(command_id="c", op="prefill", prefix_hash=P1, tenant="t",
                                    token_ids=[1, 2, 3]))
    await out.command(WarmupCommand(command_id="c", op="prefill", prefix_hash=P1, tenant="t",
                                    token_ids=[1, 2, 3]))  # a second one is not a KB effect
    got = samples(metrics)
    assert got[("ragwarm_streams_event_to_warm_seconds_count", ())] == 1
    assert got[("ragwarm_streams_event_to_warm_seconds_sum", ())] == 2.5
    assert got[("ragwarm_streams_commands_total", (("op", "prefill"),))] == 2
    assert len(out.inner.sent) == 4
