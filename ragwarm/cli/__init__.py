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
    "trace": "ragwarm.cli.trace:trace",
    "deadletter": "ragwarm.cli.deadletter:deadletter",
    "openapi": "ragwarm.cli.openapi:openapi",
    "keys": "ragwarm.cli.keys:keys",
}

# The extra each command needs beyond the base install (see pyproject.toml).
EXTRAS: dict[str, str] = {"worker": "worker", "streams": "streams", "bench": "bench",
                          "query": "client", "gateway": "client", "models": "worker",
                          "demo": "all", "replay": "bench"}
# Commands with an extra whose sub-commands also serve other installs (`models status`;
# `models fetch` checks what it needs itself).
ANY_EXTRA = frozenset({"models"})


class LazyGroup(click.Group):
    """A group whose sub-commands are "module:attribute" targets imported when used."""

    def __init__(self, *args, targets: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.targets = targets if targets is not None else COMMANDS

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, t in self.targets.items() if find_spec(t.partition(":")[0]))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # Runs before `main`'s body, the last point where the sub-command's own options
        # are visible here: `main` keeps client logs off a --json command's output.
        ctx.meta[JSON_OUTPUT] = "--json" in args
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.targets.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        if cmd_name in EXTRAS and cmd_name not in ANY_EXTRA:
            from ragwarm.cli.extras import check_extra

            problem = check_extra(cmd_name, EXTRAS[cmd_name])
            if problem is not None:
                raise click.ClickException(problem)
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            from ragwarm.cli.extras import install_hint

            raise click.ClickException(install_hint(
                cmd_name, EXTRAS.get(cmd_name, "all"), exc.name or str(exc))) from None


# ctx.meta key: whether the sub-command was asked for --json.
JSON_OUTPUT = "ragwarm.json_output"
# Client libraries that log each connection or request: noise in front of a --json answer.
CLIENT_LOGGERS = ("kafka", "httpx", "httpcore")

# Commands that run whatever the environment holds: `config` lists and checks it.
UNCHECKED = frozenset({"config"})


@click.group(cls=LazyGroup)
@click.version_option(package_name="ragwarm", prog_name="ragwarm",
                      message="%(prog)s %(version)s")
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """ragwarm: keep LLM inference workers warm for RAG, driven by knowledge-base events."""
    from ragwarm.cli.tree import ConfigTree

    # One configuration tree per run: the commands read their settings from it.
    ctx.obj = ConfigTree()
    if ctx.invoked_subcommand not in UNCHECKED:
        check_environment()
    from ragwarm.logs import configure

    configure(logging.DEBUG if verbose else logging.INFO)
    if ctx.meta.get(JSON_OUTPUT) and not verbose:
        quiet_clients()


def quiet_clients() -> None:
    """Only a client library's critical lines reach stderr: a --json command reports its
    failures itself, and a script reading it wants the JSON alone (`-v` keeps them)."""
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def check_environment() -> None:
    """Fail before any work when a RAGWARM_ variable names no setting (a misspelling)."""
    from ragwarm.cli.env import environment_problems, problems_message

    problems = environment_problems()
    if problems:
        raise click.ClickException(problems_message(problems))


if __name__ == "__main__":
    main()
