"""The Faust App of ragwarm (only the App; topics, tables and agents live beside it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust

from streams.settings import StreamsSettings


@dataclass(frozen=True)
class BrokerOptions:
    """How the app reaches Kafka, decided by the composition root (streams/ reads no env)."""

    bootstrap: str
    credentials: Any = None  # a faust.SASLCredentials / SSLCredentials, or None (PLAINTEXT)
    replication_factor: int = 1  # of the topics Faust creates itself
    acks: int = -1  # -1: all in-sync replicas


def create_app(settings: StreamsSettings, broker: BrokerOptions, data_dir: Path) -> faust.App:
    """A Faust app on `broker`; tables are in memory and rebuilt from their changelogs.

    `data_dir` holds Faust's own files (Faust would otherwise write `<app id>-data` into
    the current directory).
    """
    bootstrap = broker.bootstrap
    servers = ";".join(f"kafka://{s.strip()}" for s in bootstrap.split(","))
    return faust.App(
        settings.app_id,
        broker=servers,
        store="memory://",
        topic_partitions=settings.partitions,
        broker_credentials=broker.credentials,
        topic_replication_factor=broker.replication_factor,
        web_host=settings.web_host,
        web_port=settings.web_port,
        datadir=str(data_dir),
        web_bind=settings.web_host,
        consumer_auto_offset_reset="earliest",
        key_serializer="json",
        value_serializer="json",
        # Agents do blocking store work in a thread; allow for it before a rebalance.
        broker_max_poll_interval=600.0,
        broker_session_timeout=settings.session_timeout_s,
        table_standby_replicas=settings.standby_replicas,
        # Not waiting for in-flight records at a rebalance: a KB batch takes tens of
        # seconds. Turning it on (tried for issue 14's --streams 2 stall) made a rebalance
        # commit the held batch first, but the stall still recurred on another partition.
        stream_wait_empty=False,
        producer_acks=broker.acks,
        # Dead letters are sized against this (schemas.deadletter.value_limit): keep them equal.
        producer_max_request_size=settings.producer_max_request_bytes,
        producer_max_batch_size=min(
            settings.producer_batch_bytes, settings.producer_max_request_bytes
        ),
        # Throughput of the query log (issue 14): bigger fetches and agent queues.
        consumer_max_fetch_size=settings.consumer_max_fetch_bytes,
        stream_buffer_maxsize=settings.stream_buffer_max,
    )
