"""The `ragwarm` command: a thin shell that loads each sub-command's module on demand.

Sub-commands import torch, faust or qdrant only when run, so `ragwarm --help` stays fast.
"""

from __future__ import annotations

import importlib
import logging
from importlib.util import find_spec

import click

# name -> "module:attribute" of a click command or group.
COMMANDS: dict[str, str] = {
    "kafka": "ragwarm.cli.kafka:kafka",
    "topics": "ragwarm.cli.kafka:topics",
    "models": "ragwarm.models:models",
    "worker": "ragwarm.cli.worker:worker",
    "streams": "ragwarm.cli.streams:streams",
    "bench": "ragwarm.cli.bench:bench",
    "ingest": "ragwarm.client.ingest:ingest",
    "query": "ragwarm.cli.query:query",
    "gateway": "ragwarm.gateway.app:gateway",
    "replay": "ragwarm.cli.replay:replay",
    "up": "ragwarm.stack.local:up",
    "down": "ragwarm.stack.local:down",
    "status": "ragwarm.stack.local:status",
    "demo": "ragwarm.stack.demo:demo",
    "config": "ragwarm.cli.config:config",
    "deadletter": "ragwarm.cli.deadletter:deadletter",
    "openapi": "ragwarm.cli.openapi:openapi",
    "keys": "ragwarm.cli.keys:keys",
}

# The extra each command needs beyond the base install (see pyproject.toml).
EXTRAS: dict[str, str] = {"worker": "worker", "streams": "streams", "bench": "bench",
                          "query": "client", "gateway": "client", "models": "worker",
                          "demo": "all", "replay": "bench"}


class LazyGroup(click.Group):
    """A group whose sub-commands are "module:attribute" targets imported when used."""

    def __init__(self, *args, targets: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.targets = targets if targets is not None else COMMANDS

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, t in self.targets.items() if find_spec(t.partition(":")[0]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.targets.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            extra = EXTRAS.get(cmd_name, "all")
            raise click.ClickException(
                f"`ragwarm {cmd_name}` needs {exc.name}, which this install lacks: "
                f"pip install 'ragwarm[{extra}]'") from None


# Commands that run whatever the environment holds: `config` lists and checks it.
UNCHECKED = frozenset({"config"})


@click.group(cls=LazyGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """ragwarm: keep LLM inference workers warm for RAG, driven by knowledge-base events."""
    if ctx.invoked_subcommand not in UNCHECKED:
        check_environment()
    from ragwarm.logs import configure

    configure(logging.DEBUG if verbose else logging.INFO)


def check_environment() -> None:
    """Fail before any work when a RAGWARM_ variable names no setting (a misspelling)."""
    from ragwarm.cli.env import environment_problems, problems_message

    problems = environment_problems()
    if problems:
        raise click.ClickException(problems_message(problems))


if __name__ == "__main__":
    main()
