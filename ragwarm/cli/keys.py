"""`ragwarm keys`: derive the keys a worker is configured with from the streams app's master
signing secret (RAGWARM_STREAMS_WORKER_EVENTS_SECRET), so no worker ever holds the master.

    RAGWARM_WORKER_EVENTS_SECRET=$(ragwarm keys worker-key --worker-id w1)
    RAGWARM_WORKER_COMMANDS_KEY=$(ragwarm keys commands-key)
"""

from __future__ import annotations

import click

from schemas.signing import derive_commands_key, derive_worker_key

MASTER_ENV = "RAGWARM_STREAMS_WORKER_EVENTS_SECRET"


def _master(value: str | None) -> bytes:
    if not value:
        raise click.UsageError(f"set {MASTER_ENV} (the streams app's master signing secret)")
    return value.encode()


@click.group("keys")
def keys() -> None:
    """Derive per-worker signing keys from the streams app's master secret."""


@keys.command("worker-key")
@click.option("--worker-id", required=True, help="The worker's id (RAGWARM_WORKER_WORKER_ID).")
@click.option("--master", envvar=MASTER_ENV, show_envvar=True,
              help="Master signing secret (read from the environment; avoid the flag).")
def worker_key(worker_id: str, master: str | None) -> None:
    """Print the key worker WORKER_ID signs its events with (RAGWARM_WORKER_EVENTS_SECRET)."""
    click.echo(derive_worker_key(_master(master), worker_id))


@keys.command("commands-key")
@click.option("--master", envvar=MASTER_ENV, show_envvar=True,
              help="Master signing secret (read from the environment; avoid the flag).")
def commands_key(master: str | None) -> None:
    """Print the key workers verify warmup commands with (RAGWARM_WORKER_COMMANDS_KEY)."""
    click.echo(derive_commands_key(_master(master)))
