"""`ragwarm worker`: wire an engine, the cache, Kafka and the HTTP API into one worker process."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ragwarm.cli.tree import tree_of
from ragwarm.settings import (
    HomeSettings,
    KafkaSettings,
    ModelSettings,
    SecuritySettings,
    keyring,
)
from schemas.topics import DEADLETTER, WARMUP_COMMANDS, WORKER_EVENTS
from workers.api import Limits, PrefillRequest, WarmSetError, parse_warm_set
from workers.boot import warm_engine
from workers.commands import CommandConsumer, EventSink, KafkaEventSink, NullSink
from workers.engines.protocol import Engine
from workers.kv.cache import WarmupRefused
from workers.metrics import WorkerMetrics
from workers.runtime import WorkerRuntime, chunk_keys
from workers.service import ServiceConfig, ServiceState, serve
from workers.settings import WorkerSettings
from workers.synthesis import RateLimit, SynthesisLimits

log = logging.getLogger("ragwarm.worker")

ENGINES = ("torch", "vllm", "remote")


def model_id(settings: WorkerSettings, models: ModelSettings) -> str:
    """The model salt of prefix hashes: the setting, else the model's name (`llm_name`).

    The streams app predicts prefix hashes with `ModelSettings().llm_name`; the default
    worker must hash the same way.
    """
    return settings.model_id or models.llm_name


def advertised_url(settings: WorkerSettings, port: int) -> str:
    if settings.advertise_url:
        return settings.advertise_url.rstrip("/")
    host = settings.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://{host}:{port}"


def make_engine(settings: WorkerSettings, models: ModelSettings,
                home: HomeSettings | None = None) -> Engine:
    """Load the configured engine (blocking: model weights are read here)."""
    settings = settings.model_copy(update={"model_id": model_id(settings, models)})
    if settings.engine == "torch":
        from ragwarm.models import llm_dir, offline_hub
        from workers.engines.torch_engine import load_torch_engine

        offline_hub()
        # One tier directory per worker id under RAGWARM_HOME unless the settings name one.
        tier_path = (home or HomeSettings()).home / "kv-tier" / settings.worker_id
        return load_torch_engine(llm_dir(models=models), settings, tier_path=tier_path)
    if settings.engine == "vllm":
        from ragwarm.models import llm_dir
        from workers.engines.vllm_engine import load_vllm_engine

        return load_vllm_engine(llm_dir(models=models), settings)
    if settings.engine == "remote":
        from ragwarm.models import llm_dir, load_tokenizer
        from workers.engines.remote import connect_remote_engine

        model_dir = llm_dir(models=models)
        return connect_remote_engine(settings, model_dir, tokenizer=load_tokenizer(model_dir))
    raise click.BadParameter(f"unknown engine {settings.engine!r}; valid: {', '.join(ENGINES)}")


def engine_limits(engine: Engine, settings: WorkerSettings) -> Limits:
    """Request bounds: the settings, capped by what the model can take."""
    context = engine.max_model_len
    return Limits(
        max_prompt_tokens=min(settings.max_prompt_tokens, context - 1),
        max_tokens=settings.max_tokens,
        context_tokens=context,
        vocab_size=engine.vocab_size,
    )


def read_warm_set(path: Path | None) -> list[PrefillRequest]:
    if path is None:
        return []
    try:
        return parse_warm_set(path.read_text())
    except OSError as exc:
        raise WarmSetError(f"cannot read the warm set {path}: {exc}") from None
    except WarmSetError as exc:
        raise WarmSetError(f"{path}: {exc}") from None


def apply_warm_set(
    runtime: WorkerRuntime, items: list[PrefillRequest], report: Callable[[str], None]
) -> int:
    """Prefill the warm set in order; refusals are logged, not fatal. Returns stored count."""
    stored = 0
    for n, item in enumerate(items, 1):
        report(f"applying startup warm set ({n}/{len(items)})")
        source = item.source()
        ids = source if isinstance(source, list) else runtime.engine.tokenize(source)
        try:
            result = runtime.prefill(
                ids[: runtime.limits.max_prompt_tokens],
                tenant=item.tenant,
                chunk_refs=chunk_keys(item.chunk_refs),
                ttl_s=item.ttl_s,
                pin=item.pin,
                source="warm_set",
            )
        except WarmupRefused as exc:
            log.warning("warm set item %d refused: %s", n, exc.reason)
            continue
        stored += result.prefix_hash is not None
    return stored


class WorkerLifecycle:
    """Start: load the model, join Kafka, apply the warm set. Stop: leave Kafka."""

    def __init__(
        self,
        settings: WorkerSettings,
        kafka: KafkaSettings,
        models: ModelSettings,
        metrics: WorkerMetrics,
        url: str,
        home: HomeSettings | None = None,
    ) -> None:
        self.settings, self.kafka, self.models, self.home = settings, kafka, models, home
        self.metrics = metrics
        self.url = url
        self.consumer: CommandConsumer | None = None
        self.sink: EventSink = NullSink()
        self.kafka_sink: KafkaEventSink | None = None

    def start(self, report: Callable[[str], None]) -> WorkerRuntime:
        s = self.settings
        items = read_warm_set(s.warm_set)  # fail before the slow part
        report(f"loading model ({s.engine} engine)")
        engine = make_engine(s, self.models, self.home)
        if engine.boot_warmup_tokens:
            report(f"warming the engine ({engine.boot_warmup_tokens} tokens)")
            took = warm_engine(engine, engine.boot_warmup_tokens)
            log.info("engine warmup: %d prompt tokens and the first decode step in %.2f s",
                     engine.boot_warmup_tokens, took)
        if s.kafka:
            report(f"connecting to Kafka at {self.kafka.servers}")
            self.sink = self.kafka_sink = KafkaEventSink(
                self.kafka.servers,
                self.kafka.producer_options(),
                s.worker_id,
                topic=self.kafka.topic(WORKER_EVENTS),
                deadletter_topic=self.kafka.topic(DEADLETTER),
                connect_wait_s=s.broker_wait_s,
                secret=s.events_secret.get_secret_value().encode() if s.events_secret else None,
            )
        runtime = WorkerRuntime(
            engine,
            worker_id=s.worker_id,
            url=self.url,
            sink=self.sink,
            metrics=self.metrics,
            limits=engine_limits(engine, s),
            cache_requests=s.cache_requests,
            synthesis=SynthesisLimits(RateLimit(s.synthetic_per_minute), s.synthetic_share),
            node=s.node,
            background_max_wait_s=s.background_max_wait_s,
        )
        if s.kafka:
            report("joining warmup.commands")
            self.consumer = self._consumer(runtime)
            self.consumer.start()
            if engine.tier_state()[0]:
                self._catch_up(self.consumer, report)
        if s.restore_tier and engine.tier_state()[0]:
            report("restoring prefixes from the KV tier")
            log.info("restored %d prefixes from the KV tier", runtime.restore_tier())
        stored = apply_warm_set(runtime, items, report)
        log.info("startup warm set: %d of %d items stored", stored, len(items))
        return runtime

    def _catch_up(self, consumer: CommandConsumer, report: Callable[[str], None]) -> None:
        """A disk tier kept across a restart may hold chunks changed while the worker was
        down: their invalidations wait in warmup.commands. Serve nothing before they ran."""
        report("applying the commands sent while down (the disk tier holds prefixes)")
        if not consumer.wait_caught_up(self.settings.broker_wait_s):
            raise RuntimeError(
                "warmup.commands not caught up after "
                f"{self.settings.broker_wait_s:.0f} s: the disk tier may hold stale prefixes"
            )

    def _consumer(self, runtime: WorkerRuntime) -> CommandConsumer:
        def refuse(reason: str, command_id: str | None) -> None:
            self.metrics.malformed.inc()
            runtime.send(runtime.refused_event(reason, command_id))

        def refused(why: str, reason: str, command_id: str | None) -> None:
            self.metrics.commands_refused.labels(reason=why).inc()
            if why == "failed":  # the app's own command: it hears why (a forgery: no echo)
                runtime.send(runtime.refused_event(reason, command_id))

        key = self.settings.commands_key

        return CommandConsumer(
            self.kafka.servers,
            self.kafka.client_options(),
            self.settings.worker_id,
            runtime.apply,
            on_malformed=refuse,
            on_dead_letter=self.kafka_sink.dead_letter if self.kafka_sink else None,
            on_expired=runtime.skip_expired,
            topic=self.kafka.topic(WARMUP_COMMANDS),
            group_prefix=self.kafka.topic_prefix,
            connect_wait_s=self.settings.broker_wait_s,
            commands_key=key.get_secret_value().encode() if key else None,
            on_refused=refused,
            on_retry=lambda _c, _e: self.metrics.command_retries.inc(),
        )

    def stop(self) -> None:
        if self.consumer is not None:
            self.consumer.stop()
        self.sink.close()


def check_security(settings: WorkerSettings, insecure: bool) -> None:
    """Refuse an open API or unsigned events beyond loopback unless opted out (ragwarm.secure;
    `insecure`: the flag or RAGWARM_INSECURE)."""
    from ragwarm.secure import check_start, open_keys, unsigned_events

    exposures = open_keys("worker", settings.api_key is not None, bool(settings.tenant_keys))
    if settings.kafka:
        exposures += unsigned_events("worker", settings.events_secret is not None)
    check_start("worker", exposures, settings.host, insecure)


def _overrides(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


@click.command("worker")
@click.option("--port", type=int, help="HTTP port [RAGWARM_WORKER_PORT, 8000].")
@click.option("--host", help="Listen address [RAGWARM_WORKER_HOST, 127.0.0.1].")
@click.option("--worker-id", help="Worker id [RAGWARM_WORKER_WORKER_ID, the host name].")
@click.option("--engine", type=click.Choice(ENGINES), help="Engine [RAGWARM_WORKER_ENGINE].")
@click.option(
    "--warm-set",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON/JSONL prefixes to prefill before ready [RAGWARM_WORKER_WARM_SET].",
)
@click.option("--threads", type=int, help="torch CPU threads [RAGWARM_WORKER_THREADS].")
@click.option("--remote-url", help="Engine remote: server base URL [RAGWARM_WORKER_REMOTE_URL].")
@click.option(
    "--no-kafka", "no_kafka", is_flag=True, help="Run without warmup.commands / worker.events."
)
@click.option("--insecure", is_flag=True,
              help="Start with no key or unsigned events beyond loopback (RAGWARM_INSECURE).")
def worker(no_kafka: bool, insecure: bool, **options: Any) -> None:
    """Serve completions from a warm KV cache; take warmup commands from Kafka."""
    overrides = _overrides(**options)
    if no_kafka:
        overrides["kafka"] = False
    tree = tree_of()  # the settings `ragwarm config` shows, read once for this process
    settings = WorkerSettings(**overrides)  # the flags over the environment
    check_security(settings, insecure or tree.get(SecuritySettings).insecure)
    models = tree.models
    metrics = WorkerMetrics(worker_id=settings.worker_id, model_name=model_id(settings, models))
    url = advertised_url(settings, settings.port)
    lifecycle = WorkerLifecycle(settings, tree.kafka, models, metrics, url, tree.home)
    config = ServiceConfig(
        worker_id=settings.worker_id,
        keyring=keyring(settings.api_key, settings.tenant_keys),
        heartbeat_s=settings.heartbeat_s,
        max_body_bytes=settings.max_body_bytes,
    )
    state = ServiceState(config=config, metrics=metrics, lifecycle=lifecycle)
    sys.exit(asyncio.run(serve(state, settings.host, settings.port)))
