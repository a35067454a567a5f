"""`ragwarm streams`: wire the RAG layer into the Faust app and run it as a Faust worker."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from ragwarm.settings import HomeSettings, KafkaSettings, keyring
from streams.settings import StreamsSettings

if TYPE_CHECKING:
    from ragwarm.cli.tree import ConfigTree
    from ragwarm.rag_loading import LoadingRag
    from streams.shell.replica import ChunkReplica

log = logging.getLogger(__name__)


@dataclass
class StreamsApp:
    """The Faust app and what was defined on it."""

    app: Any
    topics: Any
    tables: Any  # streams.shell.tables.Tables: the changelog-backed tables
    deps: Any  # streams.handle.handlers.HandlerDeps: what every handler and view shares


def broker_options(kafka: KafkaSettings) -> Any:
    """The Faust app's view of `kafka`: servers, credentials, replicas and acks."""
    from ragwarm.kafka.security import faust_credentials
    from streams.shell.app import BrokerOptions

    return BrokerOptions(
        bootstrap=kafka.servers,
        credentials=faust_credentials(kafka),
        replication_factor=kafka.replication_factor or 1,
        acks=-1 if kafka.acks == "all" else int(kafka.acks),
    )


def check_security(settings: StreamsSettings, insecure: bool) -> None:
    """Refuse open views or unsigned worker events beyond loopback unless opted out
    (`insecure`: the flag or RAGWARM_INSECURE)."""
    from ragwarm.secure import check_start, open_keys, unsigned_events

    exposures = open_keys("streams", settings.api_key is not None, bool(settings.tenant_keys))
    exposures += unsigned_events("streams", settings.worker_events_secret is not None)
    check_start("streams", exposures, settings.web_host, insecure)


def build_app(streams: StreamsSettings, kafka: KafkaSettings, rag_port,
              home: HomeSettings | None = None) -> StreamsApp:
    """The Faust app with its topics, tables, agents and views around `rag_port`."""

    from schemas.topics import KB_CHANGES
    from streams.decide.hot import HotTracker
    from streams.decide.priority import PriorityExecutor
    from streams.handle.handlers import HandlerDeps, StreamTables
    from streams.shell.agents import KafkaOutbox, partition_of, register_agents
    from streams.shell.app import create_app
    from streams.shell.auth import install_auth
    from streams.shell.metrics import MeasuredOutbox, StreamsMetrics
    from streams.shell.metrics_view import register_metrics
    from streams.shell.rebalance import register_rebalance_seek
    from streams.shell.recovery import KbChangesReader, register_recovery
    from streams.shell.recovery_watch import register_recovery_watch
    from streams.shell.replica import register_replica
    from streams.shell.tables import define_tables
    from streams.shell.taskdump import register_task_dump
    from streams.shell.topics import define_topics
    from streams.shell.views import register_views

    data_dir = streams.data_dir or (home or HomeSettings()).home / "faust" / streams.app_id
    data_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(streams, broker_options(kafka), data_dir)
    topics = define_topics(app, streams.partitions, kafka.topic_prefix)
    tables = define_tables(
        app, streams.partitions, lambda tenant: partition_of(tenant, streams.partitions)
    )
    owned = owned_partitions(app, topics.queries.get_topic_name())
    metrics = StreamsMetrics()
    deps = HandlerDeps(
        tables=StreamTables(tables.docs, tables.doc_prefixes, tables.prefixes, tables.workers),
        out=MeasuredOutbox(KafkaOutbox(topics, streams.partitions,
                                       streams.worker_events_secret), metrics),
        rag=rag_port,
        settings=streams,
        tracker=HotTracker(
            streams.hot_window_s, streams.hot_step_s, streams.hot_capacity,
            rows=tables.hot_windows,
            owns=lambda tenant: partition_of(tenant, streams.partitions) in owned(),
        ),
        executor=PriorityExecutor("ragwarm-store"),
        partition_of=partition_of,
        owned_share=lambda: len(owned()) / streams.partitions,
    )
    register_agents(app, topics, deps)
    register_views(app, deps)
    register_metrics(app, deps, metrics)
    reader = KbChangesReader(kafka.servers, kafka.client_options(), kafka.topic(KB_CHANGES))
    replica = chunk_replica(deps, topics, kafka, rag_port)
    deps.replica = replica
    register_replica(app, replica)
    register_recovery(app, deps, reader)
    register_rebalance_seek(app)
    register_recovery_watch(app, streams.recovery_stall_s, deps.stats)
    register_task_dump(app)
    install_auth(app, keyring(streams.api_key, streams.tenant_keys))
    return StreamsApp(app, topics, tables, deps)


def chunk_replica(
    deps: Any, topics: Any, kafka: KafkaSettings, rag_port: Any
) -> ChunkReplica:
    """The index replica over `rag_port`'s store: followed in local mode (each instance keeps
    its own copy), not with a shared Qdrant server."""
    from aiokafka import AIOKafkaConsumer

    from ragwarm.kafka.security import aiokafka_options
    from streams.shell.replica import ChunkReplica

    def consumer() -> AIOKafkaConsumer:
        # No group: every instance reads every partition; the offsets live in the store.
        return AIOKafkaConsumer(
            bootstrap_servers=kafka.servers, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", **aiokafka_options(kafka),
        )

    follow = bool(getattr(rag_port, "replicated", False)) and deps.settings.index_replica
    if not follow and hasattr(rag_port, "replicated"):
        rag_port.replicated = False  # nobody follows: publish nothing
    return ChunkReplica(deps, rag_port, topics.chunks, topics.deadletter, consumer, follow)


def owned_partitions(app: Any, queries_topic: str):
    """A function giving the rag.queries partitions this process owns now (the tenants
    whose hot set it plans); empty until the first assignment."""

    def owned() -> set[int]:
        return {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == queries_topic}

    return owned


def wait_for_broker(kafka: KafkaSettings, wait_s: float) -> None:
    """Return once the broker answers; retry with backoff up to `wait_s` (it may be starting
    too), with one log line, then exit with a clear message instead of a traceback."""
    import time

    from ragwarm.kafka.admin import probe

    deadline, delay, warned = time.monotonic() + wait_s, 0.5, False
    while probe(kafka.servers, kafka.client_options(), timeout_s=5.0) is None:
        if time.monotonic() + delay > deadline:
            raise click.ClickException(
                f"the Kafka broker at {kafka.servers} did not answer within {wait_s:.0f} s"
            )
        if not warned:
            click.echo(
                f"streams: waiting for the Kafka broker at {kafka.servers} "
                f"(up to {wait_s:.0f} s)", err=True,
            )
            warned = True
        time.sleep(delay)
        delay = min(10.0, delay * 2)


def ensure_topics(streams_app: StreamsApp, kafka: KafkaSettings) -> None:
    """Create every topic the app reads before Faust starts.

    Faust creates changelog and internal topics itself, but a global table whose
    changelog is still missing from the metadata when recovery starts never recovers;
    creating them first, compacted, removes that race.
    """
    from ragwarm.kafka.admin import create_topics
    from schemas.topics import TopicSpec, prefixed

    partitions = streams_app.deps.settings.partitions
    specs = prefixed(kafka.topic_prefix)
    for table in vars(streams_app.tables).values():
        specs.append(
            TopicSpec(
                table.changelog_topic.get_topic_name(),
                "table key",
                partitions,
                {"cleanup.policy": "compact"},
            )
        )
    internal = streams_app.topics
    for topic in (internal.prefix_ops, internal.doc_links, internal.worker_ready):
        specs.append(TopicSpec(topic.get_topic_name(), "key", partitions))
    create_topics(kafka.servers, kafka.client_options(), specs, replicas=kafka.topic_replicas)


@click.command()
@click.option("--web-port", type=int, default=None, help="Port of the web views.")
@click.option("--loglevel", default="info", show_default=True)
@click.option("--insecure", is_flag=True,
              help="Start with open views or unsigned worker events beyond loopback "
              "(RAGWARM_INSECURE); docs/security.md.")
def streams(web_port: int | None, loglevel: str, insecure: bool) -> None:
    """Run the streams app (a Faust worker): KB changes, token frequencies, placement."""
    from faust.worker import Worker

    from ragwarm.cli.tree import tree_of
    from ragwarm.logs import faust_logging_config
    from ragwarm.settings import SecuritySettings

    tree = tree_of()  # the settings `ragwarm config` shows, read once for this process
    settings = tree.get(StreamsSettings)
    if web_port is not None:
        settings = settings.model_copy(update={"web_port": web_port})
    check_security(settings, insecure or tree.get(SecuritySettings).insecure)
    kafka = tree.kafka
    # This process owns the embedded Qdrant store; others reach it through /ragwarm/retrieve.
    rag = loading_rag(tree)
    # Loading starts first: importing torch is the longest part of a restart (issue 40). A
    # model or index that will not open stops the app (SIGTERM: Faust leaves its group
    # cleanly) and the command fails with the reason, as when it was loaded before Faust.
    rag.start(on_failure=lambda exc: os.kill(os.getpid(), signal.SIGTERM))
    built = build_app(settings, kafka, rag, tree.home)
    built.deps.loading = rag.loading
    rag.count_embedding(built.deps.stats)
    wait_for_broker(kafka, settings.broker_wait_s)
    ensure_topics(built, kafka)
    click.echo(
        f"streams: app {settings.app_id} on {kafka.servers}, "
        f"views at http://{settings.web_host}:{settings.web_port}/ragwarm/stats"
    )
    try:
        Worker(built.app, loglevel=loglevel,
               logging_config=faust_logging_config()).execute_from_commandline()
    finally:
        rag.close()
        if rag.error is not None:
            raise click.ClickException(f"streams: the RAG layer failed to load: {rag.error}")


def loading_rag(tree: ConfigTree) -> LoadingRag:
    """The RAG layer, to load beside Faust's start (`ragwarm.rag_loading`). The model
    directories are checked here, so a missing model fails at once with its hint."""
    from rag.settings import RagSettings
    from ragwarm.models import embed_model_dir, llm_dir
    from ragwarm.rag_loading import LoadingRag
    from ragwarm.rag_port import RagService
    from ragwarm.settings import qdrant_settings

    models = tree.models
    llm_dir(models=models)
    embed_model_dir(models)
    rag, qdrant = tree.get(RagSettings), qdrant_settings(tree.home)
    return LoadingRag(
        lambda on_part: RagService.open(models, rag, qdrant, on_part),
        RagService.params_of(models, rag),
        replicated=qdrant.local,
    )
