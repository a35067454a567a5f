"""`ragwarm kafka start|stop|status` and `ragwarm topics create|list`."""

from __future__ import annotations

import json
import logging
import shlex

import click
from kafka.errors import KafkaError

from ragwarm.kafka.admin import create_topics, list_topics
from ragwarm.kafka.local import KafkaLaunchError, LocalKafka
from ragwarm.settings import HomeSettings, KafkaSettings
from schemas.topics import TOPICS, prefixed


def _quiet_client_logs() -> None:
    # kafka-python logs every connection (and every refused probe) itself; failures reach the
    # user as one error message, so its own lines only show with `ragwarm -v`.
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


def _unreachable(settings: KafkaSettings, exc: KafkaError) -> click.ClickException:
    hint = "" if settings.bootstrap else " (is the local broker running? `ragwarm kafka start`)"
    return click.ClickException(f"{settings.servers}: {exc}{hint}")


def _local(secure: bool = False) -> LocalKafka:
    if secure:
        from ragwarm.kafka.secure import SecureLocalKafka

        return SecureLocalKafka(HomeSettings(), KafkaSettings(), say=click.echo)
    return LocalKafka(HomeSettings(), KafkaSettings(), say=click.echo)


@click.group()
def kafka() -> None:
    """The local single-node Apache Kafka broker (KRaft)."""
    _quiet_client_logs()


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
    _quiet_client_logs()


@topics.command()
def create() -> None:
    """Create the missing ragwarm topics; existing ones are left as they are."""
    settings = KafkaSettings()
    try:
        created, existing = create_topics(
            settings.servers,
            settings.client_options(),
            prefixed(settings.topic_prefix),
            replicas=settings.topic_replicas,
        )
    except KafkaError as exc:
        raise _unreachable(settings, exc) from None
    for name in created:
        spec = TOPICS[name.removeprefix(settings.topic_prefix)]
        click.echo(f"created   {name} ({spec.partitions} partitions)")
    for name in existing:
        click.echo(f"existing  {name}")


@topics.command("list")
def list_() -> None:
    """List the cluster's topics with their partition counts."""
    settings = KafkaSettings()
    try:
        found = list_topics(settings.servers, settings.client_options())
    except KafkaError as exc:
        raise _unreachable(settings, exc) from None
    for name, partitions in found.items():
        mark = "  (ragwarm)" if name in TOPICS else ""
        click.echo(f"{name:<32} {partitions:>4} partitions{mark}")
