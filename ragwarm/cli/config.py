"""`ragwarm config`: every RAGWARM_ setting with its default and meaning, from the models."""

from __future__ import annotations

import importlib

import click
from pydantic_settings import BaseSettings

# module:class of every component's settings; the README's table is generated from these.
SETTINGS: tuple[str, ...] = (
    "ragwarm.settings:HomeSettings",
    "ragwarm.settings:KafkaSettings",
    "ragwarm.settings:ModelSettings",
    "ragwarm.settings:StackSettings",
    "ragwarm.kafka.local:LocalKafkaSettings",
    "rag.settings:RagSettings",
    "rag.settings:QdrantSettings",
    "workers.settings:WorkerSettings",
    "streams.settings:StreamsSettings",
    "ragwarm.client.settings:ClientSettings",
    "ragwarm.gateway.settings:GatewaySettings",
    "ragwarm.bench.strategies.settings:StrategySettings",
)


def settings_classes() -> list[type[BaseSettings]]:
    found = []
    for target in SETTINGS:
        module, _, name = target.partition(":")
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue  # a component not installed in this checkout
    return found


def rows(cls: type[BaseSettings]) -> list[tuple[str, str, str]]:
    prefix = cls.model_config.get("env_prefix", "")
    out = []
    for name, field in cls.model_fields.items():
        default = "(computed)" if field.default_factory else repr(field.default)
        out.append((f"{prefix}{name}".upper(), default, field.description or ""))
    return out


def markdown() -> str:
    lines = []
    for cls in settings_classes():
        lines += [
            f"**{cls.__name__}** — {(cls.__doc__ or '').strip()}",
            "",
            "| variable | default | meaning |",
            "|---|---|---|",
        ]
        lines += [f"| `{v}` | `{d}` | {m} |" for v, d, m in rows(cls)]
        lines.append("")
    return "\n".join(lines)


@click.command("config")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print the README's table.")
def config(as_markdown: bool) -> None:
    """List every RAGWARM_ setting with its default and meaning."""
    if as_markdown:
        click.echo(markdown())
        return
    for cls in settings_classes():
        click.echo(f"[{cls.__name__}]")
        for var, default, meaning in rows(cls):
            click.echo(f"  {var:<40} {default:<28} {meaning}")
