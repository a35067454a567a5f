"""The streams app's `/metrics` page and the scrape-time figures it reads from Faust."""

from __future__ import annotations

import logging
from typing import Any

from faust.web import Request, Response

from streams.handle.handlers import HandlerDeps
from streams.shell.metrics import CONTENT_TYPE, StreamsMetrics, snapshot
from streams.shell.views import register

log = logging.getLogger(__name__)
METRICS_PATH = "/metrics"


def register_metrics(app: Any, p: HandlerDeps, metrics: StreamsMetrics) -> None:
    """Serve `metrics` on `/metrics`, with the pipeline's and Faust's figures read per scrape."""
    metrics.watch(lambda: snapshot(
        p.stats,
        {name: len(table) for name, table in vars(p.tables).items()},
        len(p.tracker.hot),
        app.monitor.messages_received_by_topic,
        app.monitor.messages_sent_by_topic,
        consumer_lag(app),
    ))

    async def prometheus(web, request: Request) -> Response:
        return web.bytes(metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    register(app, METRICS_PATH, prometheus)


def consumer_lag(app: Any) -> dict[tuple[str, int], int]:
    """High watermark minus committed offset per assigned partition; {} when unknown.

    Faust keeps both in memory (the watermark from the last fetch), so this costs no call
    to the broker; it reads a private map of the consumer, hence the guard.
    """
    try:
        consumer = app.consumer
        committed = consumer._committed_offset
        lag = {}
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None:
                lag[(tp.topic, tp.partition)] = max(0, high - (committed.get(tp) or 0))
        return lag
    except Exception as exc:  # noqa: BLE001 - lag is optional; the rest must still export
        log.debug("consumer lag unavailable: %s", exc)
        return {}
