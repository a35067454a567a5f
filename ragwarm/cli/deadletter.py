"""`ragwarm deadletter list|redrive`: look at dead letters and send them to their topics again."""

from __future__ import annotations

import json

import click
from kafka.errors import KafkaError

from ragwarm.cli.tree import tree_of
from ragwarm.kafka import deadletter as dl
from ragwarm.kafka.common import quiet_client_logs, unreachable_message
from ragwarm.settings import KafkaSettings
from schemas.topics import DEADLETTER

REASON = click.option(
    "--reason", default=None, help="Only letters whose reason contains this (any case)."
)


@click.group()
def deadletter() -> None:
    """Records the streams app could not process: list them, re-send them."""
    quiet_client_logs()


def _letters(settings: KafkaSettings, reason: str | None) -> list[dl.Letter]:
    try:
        found = dl.read_letters(
            settings.servers, settings.client_options(), settings.topic(DEADLETTER)
        )
        return dl.select(found, reason)
    except KafkaError as exc:
        raise click.ClickException(unreachable_message(settings.servers, exc)) from None


@deadletter.command("list")
@REASON
@click.option("--json", "as_json", is_flag=True, help="One JSON object per letter.")
def list_letters(reason: str | None, as_json: bool) -> None:
    """Every dead letter (or those matching --reason), oldest first."""
    for letter in _letters(tree_of().kafka, reason):
        row = dl.summary(letter)
        if as_json:
            click.echo(json.dumps(row))
        else:
            mark = " (truncated)" if row["truncated"] else ""
            mark += f" (redriven {row['redriven']})" if row["redriven"] else ""
            click.echo(f"{row['at']}  {row['source']}  {row['bytes']} B{mark}  {row['reason']}")


@deadletter.command()
@REASON
@click.option("--dry-run", is_flag=True, help="Show what would be sent; send nothing.")
@click.option(
    "--allow-topic", "allow", multiple=True, metavar="TOPIC",
    help="A topic letters may be sent to (repeat it); it replaces the default list: the "
    "topics ragwarm's consumers dead-letter from, with RAGWARM_KAFKA_TOPIC_PREFIX.",
)
@click.option("--again", is_flag=True, help="Also send letters a redrive sent before.")
def redrive(reason: str | None, dry_run: bool, allow: tuple[str, ...], again: bool) -> None:
    """Send dead letters (or those matching --reason) to their original topics again.

    A truncated letter's record is read back from its topic and offset and checked
    against its sha256. Only topics ragwarm dead-letters from are sent to (anyone who can
    write the dead-letter topic can write a letter), and each letter sent is marked, so a
    second redrive skips it. Run it once the cause is fixed: a record that fails again is
    dead-lettered again.
    """
    settings = tree_of().kafka
    allowed = set(allow) or {settings.topic(name) for name in dl.REDRIVE_TOPICS}
    letters = _letters(settings, reason)
    fetch = dl.original_fetcher(settings.servers, settings.client_options())
    plans = [dl.plan_redrive(letter, fetch, allowed, again) for letter in letters]
    for p in plans:
        state = f"skipped: {p.skipped}" if p.skipped else f"-> {p.topic}"
        click.echo(f"{p.letter.partition}@{p.letter.offset}  {state}")
    ready = sum(p.skipped is None for p in plans)
    if dry_run:
        click.echo(f"dry run: {ready} of {len(plans)} letters would be sent")
        return
    sent = dl.send_all(settings.servers, settings.client_options(), plans,
                       settings.topic(DEADLETTER))
    click.echo(f"sent {sent} of {len(plans)} letters")
