"""`ragwarm up|down|status`: the local stack (Kafka, topics, streams, workers) in the background."""

from __future__ import annotations

import json

import click
import httpx

from ragwarm.settings import HomeSettings, KafkaSettings, StackSettings
from ragwarm.stack.procs import Proc, operator_headers
from streams.settings import StreamsSettings


class Stack:
    """The parts of the local stack and their order: Kafka first up, last down."""

    def __init__(
        self,
        home: HomeSettings | None = None,
        kafka: KafkaSettings | None = None,
        stack: StackSettings | None = None,
        streams: StreamsSettings | None = None,
    ):
        self.home = home or HomeSettings()
        self.kafka_settings = kafka or KafkaSettings()
        self.settings = stack or StackSettings()
        self.streams_settings = streams or StreamsSettings()
        env = {"RAGWARM_KAFKA_BOOTSTRAP": self.kafka_settings.servers}
        run = self.home.run_dir
        base = f"http://{self.streams_settings.web_host}:{self.streams_settings.web_port}"
        self.streams_url = base
        self.streams = Proc("streams", ["streams"], run, f"{base}/ragwarm/health", env)
        self.workers = [
            Proc(
                f"worker-{i + 1}",
                ["worker", "--worker-id", f"w{i + 1}", "--port", str(port)],
                run,
                f"http://127.0.0.1:{port}/health/ready",
                env,
            )
            for i, port in enumerate(
                range(self.settings.worker_port, self.settings.worker_port + self.settings.workers)
            )
        ]

        port = self.settings.gateway_port
        self.gateway_url = f"http://127.0.0.1:{port}"
        self.gateway = Proc("gateway", ["gateway", "--port", str(port)], run,
                            f"{self.gateway_url}/health/ready",
                            {**env, "RAGWARM_CLIENT_STREAMS_URL": base})

    def worker_url(self, proc: Proc) -> str:
        return proc.health_url.removesuffix("/health/ready")

    def up(self, echo=click.echo) -> None:
        from ragwarm.kafka.admin import create_topics
        from ragwarm.kafka.local import LocalKafka

        broker = LocalKafka(self.home, self.kafka_settings)
        if broker.external:
            echo(f"kafka: using the cluster at {broker.bootstrap} (RAGWARM_KAFKA_BOOTSTRAP)")
        else:
            state = "started" if broker.start() else "already running"
            echo(f"kafka: {state} at {broker.bootstrap}")
        from schemas.topics import prefixed

        created, existing = create_topics(
            broker.bootstrap,
            self.kafka_settings.client_options(),
            prefixed(self.kafka_settings.topic_prefix),
            replicas=self.kafka_settings.topic_replicas,
        )
        echo(f"topics: {len(created)} created, {len(existing)} already there")
        for proc in [self.streams, *self.workers]:
            started = proc.start()
            echo(
                f"{proc.name}: {'starting' if started else 'already running'} (log {proc.log_file})"
            )
        for proc in [self.streams, *self.workers]:
            proc.wait_healthy(self.settings.start_timeout_s)
            echo(f"{proc.name}: healthy")
        # Last: it is ready once the streams app answers and it has its tokenizer.
        echo(f"gateway: {'starting' if self.gateway.start() else 'already running'} "
             f"(log {self.gateway.log_file})")
        self.gateway.wait_healthy(self.settings.start_timeout_s)
        echo(f"gateway: healthy, OpenAI base URL {self.gateway_url}/v1")

    def down(self, echo=click.echo) -> None:
        from ragwarm.kafka.local import LocalKafka

        for proc in [self.gateway, *self.workers, self.streams]:
            echo(f"{proc.name}: {'stopped' if proc.stop() else 'not running'}")
        broker = LocalKafka(self.home, self.kafka_settings)
        if not broker.external:
            echo(f"kafka: {'stopped' if broker.stop() else 'not running'}")

    def status(self) -> dict:
        from ragwarm.kafka.local import LocalKafka

        report: dict = {"kafka": LocalKafka(self.home, self.kafka_settings).status()}
        report["streams"] = {
            "pid": self.streams.pid(),
            "healthy": self.streams.healthy(),
            "url": self.streams_url,
            "stats": _get(f"{self.streams_url}/ragwarm/stats", operator_headers("streams")),
        }
        for proc in self.workers:
            url = self.worker_url(proc)
            report[proc.name] = {
                "pid": proc.pid(),
                "ready": proc.healthy(),
                "url": url,
                "cache": _get(f"{url}/v1/cache", operator_headers("worker")),
            }
        report["gateway"] = {"pid": self.gateway.pid(), "healthy": self.gateway.healthy(),
                             "url": self.gateway_url}
        return report


def _get(url: str, headers: dict[str, str]) -> dict | None:
    try:
        response = httpx.get(url, timeout=3.0, headers=headers)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


@click.command()
def up() -> None:
    """Start Kafka, the topics, the streams app and the workers in the background."""
    Stack().up()


@click.command()
def down() -> None:
    """Stop the workers, the streams app and the local Kafka."""
    Stack().down()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(as_json: bool) -> None:
    """Each part of the local stack, its health and the cache figures."""
    report = Stack().status()
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    kafka = report.pop("kafka")
    click.echo(
        f"kafka    running={kafka.get('running')} bootstrap={kafka.get('bootstrap')} "
        f"version={kafka.get('version')}"
    )
    for name, part in report.items():
        ok = part.get("healthy", part.get("ready"))
        click.echo(f"{name:<9}pid={part['pid']} healthy={ok} url={part['url']}")
        figures = part.get("stats") or part.get("cache")
        if figures:
            click.echo(f"         {json.dumps(figures, default=str)[:300]}")
