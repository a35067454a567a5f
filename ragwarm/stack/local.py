"""`ragwarm up|down|status`: the local stack (Kafka, topics, streams, workers) in the background."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import httpx
from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from ragwarm.kafka.admin import probe
from ragwarm.kafka.common import quiet_client_logs, unreachable_message
from ragwarm.settings import HomeSettings, KafkaSettings, SecuritySettings, StackSettings
from ragwarm.stack.keys import StackKeys, StackSecurity, load, load_or_create
from ragwarm.stack.procs import Proc, bearer, port_conflicts
from streams.settings import StreamsSettings

# The streams app's math on one thread. Its embedder runs one torch thread already
# (RAGWARM_RAG_EMBED_THREADS), but its BLAS/OpenMP pools still start a thread per core, and
# idle pool threads spin for a while after each call: on a host it shares with the workers
# they took the cores of the request that follows a retrieval (the demo's routed warm asks
# ran 126-190 ms against 43-85 ms for the same prompt on the same worker a second later;
# 45-85 ms with these caps; docs/lab/benchmarks-notebook.md). A value set in the environment
# is kept.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class Stack:
    """The parts of the local stack and their order: Kafka first up, last down."""

    def __init__(
        self,
        home: HomeSettings | None = None,
        kafka: KafkaSettings | None = None,
        stack: StackSettings | None = None,
        streams: StreamsSettings | None = None,
        keys: StackKeys | None = None,
        insecure: bool = False,
    ):
        """`keys`: those to start the processes with (`stack_keys`); unset, the stored ones,
        enough for `status` and `down`, which start nothing."""
        self.home = home or HomeSettings()
        self.kafka_settings = kafka or KafkaSettings()
        self.settings = stack or StackSettings()
        self.streams_settings = streams or StreamsSettings()
        if keys is None and not insecure:
            keys = load(self.home.keys_dir)
        self.security = StackSecurity(keys, dict(os.environ), insecure)
        env = {"RAGWARM_KAFKA_BOOTSTRAP": self.kafka_settings.servers}
        self.env = env
        streams_n = max(self.settings.streams, _running(self.home.run_dir, "streams"))
        workers_n = max(self.settings.workers, _running(self.home.run_dir, "worker"))
        self.streams_all = [self._streams_proc(i) for i in range(streams_n)]
        self.streams = self.streams_all[0]
        self.streams_url = self.streams.health_url.removesuffix("/ragwarm/health")
        self.workers = [self._worker_proc(i) for i in range(workers_n)]

        port = self.settings.gateway_port
        self.gateway_url = f"http://127.0.0.1:{port}"
        self.gateway = Proc("gateway", ["gateway", "--port", str(port)], self.home.run_dir,
                            f"{self.gateway_url}/health/ready",
                            {**env, "RAGWARM_CLIENT_STREAMS_URL": self.streams_url,
                             **self.security.gateway()})

    def _streams_proc(self, i: int) -> Proc:
        """Instance i+1 of the streams app: one app id (one consumer group), its own web port
        and, from the second on, its own local Qdrant and Faust data under RAGWARM_HOME."""
        s = self.streams_settings
        port = s.web_port + i
        base = f"http://{s.web_host}:{port}"
        env = self.env | {k: v for k, v in ONE_THREAD.items() if k not in os.environ}
        env |= self.security.streams()
        if i:
            own = self.home.home / f"streams-{i + 1}"
            env |= {"RAGWARM_STREAMS_WEB_PORT": str(port),
                    "RAGWARM_STREAMS_DATA_DIR": str(own / "faust"),
                    "RAGWARM_QDRANT_PATH": str(own / "qdrant")}
        name = "streams" if i == 0 else f"streams-{i + 1}"
        return Proc(name, ["streams"], self.home.run_dir, f"{base}/ragwarm/health", env)

    @property
    def worker_ids(self) -> list[str]:
        """The ids `ragwarm up` gives its workers, in the order of `workers`."""
        return [worker_id(i) for i in range(len(self.workers))]

    def commands_behind(self) -> int:
        """`warmup.commands` records the workers have not carried out yet (all of them)."""
        from ragwarm.kafka.admin import commands_behind

        return sum(commands_behind(self.kafka_settings, self.worker_ids).values())

    def _worker_proc(self, i: int) -> Proc:
        port = self.settings.worker_port + i
        wid = worker_id(i)
        return Proc(f"worker-{i + 1}", ["worker", "--worker-id", wid, "--port", str(port)],
                    self.home.run_dir, f"http://127.0.0.1:{port}/health/ready",
                    self.env | self.security.worker(wid))

    def worker_url(self, proc: Proc) -> str:
        return proc.health_url.removesuffix("/health/ready")

    def up(self, echo=click.echo) -> None:
        from ragwarm.kafka.admin import create_topics
        from ragwarm.kafka.local import LocalKafka

        self.check_ports()
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
        for proc in [*self.streams_all, *self.workers]:
            started = proc.start()
            echo(
                f"{proc.name}: {'starting' if started else 'already running'} (log {proc.log_file})"
            )
        for proc in [*self.streams_all, *self.workers]:
            proc.wait_healthy(self.settings.start_timeout_s)
            echo(f"{proc.name}: healthy")
        # Last: it is ready once the streams app answers and it has its tokenizer.
        echo(f"gateway: {'starting' if self.gateway.start() else 'already running'} "
             f"(log {self.gateway.log_file})")
        self.gateway.wait_healthy(self.settings.start_timeout_s)
        echo(f"gateway: healthy, OpenAI base URL {self.gateway_url}/v1")
        for line in security_lines(self.security):
            echo(line)

    def check_ports(self) -> None:
        """Refuse to start when the processes to start cannot all have their ports."""
        procs = [p for p in [*self.streams_all, *self.workers, self.gateway] if p.pid() is None]
        problems = port_conflicts(procs)
        if problems:
            raise click.ClickException(
                "; ".join(problems) + ". Set RAGWARM_STREAMS_WEB_PORT, "
                "RAGWARM_STACK_WORKER_PORT (workers count up from it) or RAGWARM_GATEWAY_PORT "
                "to free ports."
            )

    def headers(self, variable: str) -> dict[str, str]:
        """The operator header for the process reading its key from `variable`."""
        return bearer(self.security.key_of(variable))

    def down(self, echo=click.echo) -> None:
        from ragwarm.kafka.local import LocalKafka

        for proc in [self.gateway, *self.workers, *reversed(self.streams_all)]:
            echo(f"{proc.name}: {'stopped' if proc.stop() else 'not running'}")
        broker = LocalKafka(self.home, self.kafka_settings)
        if not broker.external:
            echo(f"kafka: {'stopped' if broker.stop() else 'not running'}")

    def status(self) -> dict:
        from ragwarm.kafka.local import LocalKafka

        report: dict = {"kafka": LocalKafka(self.home, self.kafka_settings).status()}
        for proc in self.streams_all:
            url = proc.health_url.removesuffix("/ragwarm/health")
            report[proc.name] = {
                "pid": proc.pid(),
                "healthy": proc.healthy(),
                "url": url,
                "stats": _get(f"{url}/ragwarm/stats", self.headers("RAGWARM_STREAMS_API_KEY")),
            }
        for proc in self.workers:
            url = self.worker_url(proc)
            report[proc.name] = {
                "pid": proc.pid(),
                "ready": proc.healthy(),
                "url": url,
                "cache": _get(f"{url}/v1/cache", self.headers("RAGWARM_WORKER_API_KEY")),
            }
        report["gateway"] = {"pid": self.gateway.pid(), "healthy": self.gateway.healthy(),
                             "url": self.gateway_url}
        return report


def stack_keys(home: HomeSettings, insecure: bool) -> StackKeys | None:
    """The keys `up` starts the stack with: made on the first start, then reused; none when
    the user opted out with --insecure or RAGWARM_INSECURE."""
    return None if insecure else load_or_create(home.keys_dir)


def security_lines(security: StackSecurity) -> list[str]:
    """What `up` says about the keys: where they are and how to send them."""
    if security.keys is None:
        named = "your own keys" if security.operator else "no keys: the views, the workers "\
            "and the gateway are open and worker events unsigned"
        return [f"security: --insecure, {named} (docs/security.md)"]
    keys = security.keys
    signing = f"signing secret in {keys.signing_file} (files mode 0600; docs/security.md)"
    if security.operator != keys.operator:
        return [f"security: operator key from your RAGWARM_*_API_KEY setting, {signing}",
                "security: clients send it as `Authorization: Bearer <key>` "
                "(RAGWARM_CLIENT_API_KEY for `ragwarm query`)"]
    lines = [f"security: operator key in {keys.operator_file}, {signing}"]
    if keys.created:
        lines.append(f"security: new operator key {keys.operator} (printed this once)")
    lines.append(f"security: send it as `Authorization: Bearer $(cat {keys.operator_file})`; "
                 f"for `ragwarm query`: export RAGWARM_CLIENT_API_KEY=$(cat {keys.operator_file})")
    return lines


def _running(run_dir: Path, kind: str) -> int:
    """The highest instance number of `kind` (streams, worker) the pid files name, so
    `down` and `status` reach every process `up --streams N --workers M` started."""
    found = [0]
    for pid_file in run_dir.glob(f"{kind}*.pid"):
        tail = pid_file.stem.removeprefix(kind)
        if tail == "":
            found.append(1)
        elif tail.startswith("-") and tail[1:].isdigit():
            found.append(int(tail[1:]))
    return max(found)


def _get(url: str, headers: dict[str, str]) -> dict | None:
    try:
        response = httpx.get(url, timeout=3.0, headers=headers)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


@click.command()
@click.option("--streams", "streams_n", type=click.IntRange(1, 8), default=None,
              help="Streams instances (one consumer group); default RAGWARM_STACK_STREAMS.")
@click.option("--workers", "workers_n", type=click.IntRange(1, 8), default=None,
              help="Workers; default RAGWARM_STACK_WORKERS.")
@click.option("--insecure", is_flag=True,
              help="Generate no keys: open views, worker API and gateway, unsigned worker "
              "events [RAGWARM_INSECURE].")
def up(streams_n: int | None, workers_n: int | None, insecure: bool) -> None:
    """Start Kafka, the topics, the streams instances and the workers in the background.

    The first start generates an operator key and a signing secret under RAGWARM_HOME/keys
    (reused later) and gives them to every process; see docs/security.md.
    """
    settings = StackSettings()
    given = {"streams": streams_n, "workers": workers_n}
    settings = settings.model_copy(update={k: v for k, v in given.items() if v is not None})
    insecure = insecure or SecuritySettings().insecure
    home = HomeSettings()
    stack = Stack(home, stack=settings, keys=stack_keys(home, insecure), insecure=insecure)
    kafka = stack.kafka_settings
    quiet_client_logs()  # a refused connection is reported once, below, with the fix
    # A cluster named by RAGWARM_KAFKA_BOOTSTRAP is not started here: fail in seconds if it is
    # not there, rather than after the client's 30 s bootstrap.
    if kafka.bootstrap and probe(kafka.servers, kafka.client_options(), 5.0) is None:
        raise click.ClickException(unreachable_message(kafka.servers))
    try:
        stack.up()
    except (KafkaTimeoutError, KafkaConnectionError) as exc:
        raise click.ClickException(unreachable_message(kafka.servers, exc)) from None


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


def worker_id(i: int) -> str:
    """The id of the stack's `i`-th worker (from 0)."""
    return f"w{i + 1}"
