"""`ragwarm config`: every RAGWARM_ setting with its default and meaning, and `--check`."""

from __future__ import annotations

import click
from pydantic_settings import BaseSettings

from ragwarm.cli.env import environment_problems, problems_message, settings_classes

__all__ = ["config", "markdown", "rows", "settings_classes"]


def rows(cls: type[BaseSettings]) -> list[tuple[str, str, str]]:
    prefix = cls.model_config.get("env_prefix", "")
    out = []
    for name, field in cls.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseSettings):
            continue  # a nested component's settings: listed under their own class
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
@click.option("--markdown", "as_markdown", is_flag=True,
              help="Print the table of docs/configuration.md.")
@click.option("--check", is_flag=True,
              help="Check that every RAGWARM_ variable set names a setting: 'ok', or the "
              "unknown ones with the nearest valid name and exit status 1.")
def config(as_markdown: bool, check: bool) -> None:
    """List every RAGWARM_ setting with its default and meaning."""
    if check:
        problems = environment_problems()
        if problems:
            raise click.ClickException(problems_message(problems))
        click.echo("ok")
        return
    if as_markdown:
        click.echo(markdown())
        return
    for cls in settings_classes():
        click.echo(f"[{cls.__name__}]")
        for var, default, meaning in rows(cls):
            click.echo(f"  {var:<40} {default:<28} {meaning}")
