"""`ragwarm kafka start|stop|status` and `ragwarm topics create|list`."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

import click
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from ragwarm.cli.tree import tree_of
from ragwarm.kafka.admin import admin_client, create_topics, list_topics
from ragwarm.kafka.common import quiet_client_logs, unreachable_message
from ragwarm.kafka.local import KafkaLaunchError, LocalKafka
from ragwarm.settings import KafkaSettings
from schemas.topics import TOPICS, prefixed

# How long a command waits for a broker to answer before saying it is unreachable: kafka-python
# otherwise tries for its whole request timeout (30 s) before it gives up.
CONNECT_TIMEOUT_S = 5.0


@contextmanager
def _admin_errors(settings: KafkaSettings) -> Iterator[None]:
    """Turn a client failure into one CLI error; an unreachable broker names the fixes."""
    try:
        yield
    except (KafkaTimeoutError, KafkaConnectionError) as exc:
        raise click.ClickException(unreachable_message(settings.servers, exc)) from None
    except KafkaError as exc:
        raise click.ClickException(f"{settings.servers}: {exc}") from None


def _check_reachable(settings: KafkaSettings) -> None:
    """Fail within CONNECT_TIMEOUT_S when no broker answers (the admin client bootstraps as
    it opens)."""
    with admin_client(settings.servers, settings.client_options(), CONNECT_TIMEOUT_S):
        pass


def _local(secure: bool = False) -> LocalKafka:
    tree = tree_of()
    if secure:
        from ragwarm.kafka.secure import SecureLocalKafka

        return SecureLocalKafka(tree.home, tree.kafka, say=click.echo)
    return LocalKafka(tree.home, tree.kafka, say=click.echo)


@click.group()
def kafka() -> None:
    """The local single-node Apache Kafka broker (KRaft)."""
    quiet_client_logs()


@kafka.command()
@click.option(
    "--secure",
    is_flag=True,
    help="Only a SASL_SSL listener (SCRAM-SHA-512, a local CA); prints the client settings.",
)
def start(secure: bool) -> None:
    """Start the broker in the background (fetching its jars once); no-op if it runs."""
    from ragwarm.kafka.secure import SecureSetupError

    broker = _local(secure)
    try:
        broker.start()
    except (KafkaLaunchError, SecureSetupError) as exc:
        raise click.ClickException(str(exc)) from None
    if secure:
        env = broker.material.client_env()  # type: ignore[attr-defined]
        where = broker.material.dir / "client.env"  # type: ignore[attr-defined]
        click.echo(f"Clients connect with these settings (`. {where}` sets them):")
        for name, value in env.items():
            click.echo(f"export {name}={shlex.quote(value)}")


@kafka.command()
@click.option("--force", is_flag=True, help="Stop it even while test sessions or services use it.")
def stop(force: bool) -> None:
    """Stop the broker; exits 0 when none is running."""
    try:
        _local().stop(force=force)
    except KafkaLaunchError as exc:
        raise click.ClickException(str(exc)) from None


@kafka.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(as_json: bool) -> None:
    """Whether the broker runs, its pid, bootstrap servers, Kafka version and data folder."""
    info = _local().status()
    if as_json:
        click.echo(json.dumps(info))
        return
    click.echo(f"running:   {'yes' if info['running'] else 'no'}")
    for key in ("pid", "bootstrap", "version", "data_dir", "log", "jars", "users"):
        if key in info:
            value = info[key]
            if isinstance(value, list):
                value = ", ".join(map(str, value))
            click.echo(f"{key + ':':<10} {value if value not in (None, '') else '-'}")
    if info["external"]:
        click.echo("external:  yes (RAGWARM_KAFKA_BOOTSTRAP); version not managed by ragwarm")


@click.group()
def topics() -> None:
    """The Kafka topics ragwarm uses (defined in schemas/topics.py)."""
    quiet_client_logs()


@topics.command()
def create() -> None:
    """Create the missing ragwarm topics; existing ones are left as they are."""
    settings = tree_of().kafka
    with _admin_errors(settings):
        _check_reachable(settings)
        created, existing = create_topics(
            settings.servers,
            settings.client_options(),
            prefixed(settings.topic_prefix),
            replicas=settings.topic_replicas,
        )
    for name in created:
        spec = TOPICS[name.removeprefix(settings.topic_prefix)]
        click.echo(f"created   {name} ({spec.partitions} partitions)")
    for name in existing:
        click.echo(f"existing  {name}")


@topics.command("list")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: topic -> partitions, ragwarm's own.")
def list_(as_json: bool) -> None:
    """List the cluster's topics with their partition counts."""
    settings = tree_of().kafka
    with _admin_errors(settings):
        _check_reachable(settings)
        found = list_topics(settings.servers, settings.client_options())
    ours = {settings.topic(name) for name in TOPICS}  # with RAGWARM_KAFKA_TOPIC_PREFIX
    if as_json:
        click.echo(json.dumps({name: {"partitions": n, "ragwarm": name in ours}
                               for name, n in found.items()}))
        return
    for name, partitions in found.items():
        mark = "  (ragwarm)" if name in ours else ""
        click.echo(f"{name:<32} {partitions:>4} partitions{mark}")
