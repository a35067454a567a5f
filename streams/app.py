"""The Faust App of ragwarm (only the App; topics, tables and agents live beside it)."""

from __future__ import annotations

from pathlib import Path

import faust

from streams.settings import StreamsSettings


def create_app(settings: StreamsSettings, bootstrap: str, data_dir: Path) -> faust.App:
    """A Faust app on `bootstrap`; tables are in memory and rebuilt from their changelogs.

    `data_dir` holds Faust's own files (Faust would otherwise write `<app id>-data` into
    the current directory).
    """
    servers = ";".join(f"kafka://{s.strip()}" for s in bootstrap.split(","))
    return faust.App(
        settings.app_id,
        broker=servers,
        store="memory://",
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        web_host=settings.web_host,
        web_port=settings.web_port,
        datadir=str(data_dir),
        web_bind=settings.web_host,
        consumer_auto_offset_reset="earliest",
        key_serializer="json",
        value_serializer="json",
        # Agents do blocking store work in a thread; allow for it before a rebalance.
        broker_max_poll_interval=600.0,
        stream_wait_empty=False,
        producer_acks=-1,
    )
