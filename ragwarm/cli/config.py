"""`ragwarm config`: every RAGWARM_ setting's value in effect and its source, the table of
defaults and meanings (`--markdown`), and `--check`."""

from __future__ import annotations

import json
from typing import Any

import click
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from ragwarm.cli.env import environment_problems, problems_message, settings_classes
from ragwarm.cli.tree import ConfigTree, Setting, effective, tree_of

__all__ = ["config", "in_effect", "markdown", "rows", "settings_classes"]


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
@click.option("--json", "as_json", is_flag=True,
              help="Print the values in effect as JSON: component -> variable -> value, "
              "source (default or env), default.")
@click.option("--markdown", "as_markdown", is_flag=True,
              help="Print the table of docs/configuration.md.")
@click.option("--check", is_flag=True,
              help="Check that every RAGWARM_ variable set names a setting: 'ok', or the "
              "unknown ones with the nearest valid name and exit status 1.")
@click.pass_context
def config(ctx: click.Context, as_json: bool, as_markdown: bool, check: bool) -> None:
    """Every RAGWARM_ setting's value in effect and where it came from (default or env).

    Secrets print masked. `--markdown` prints the defaults and meanings instead.
    """
    if check:
        problems = environment_problems()
        if problems:
            raise click.ClickException(problems_message(problems))
        click.echo("ok")
        return
    if as_markdown:
        click.echo(markdown())
        return
    found, errors = in_effect(tree_of(ctx))
    unknown = [str(p) for p in environment_problems()]
    if as_json:
        out: dict[str, Any] = {
            component: {s.variable: {"value": s.value, "source": s.source, "default": s.default}
                        for s in rows}
            for component, rows in found.items()
        }
        click.echo(json.dumps(out | {"errors": errors, "unknown": unknown}, indent=2))
    else:
        _print_text(found, errors, unknown)
    if errors:
        ctx.exit(1)


def in_effect(tree: ConfigTree) -> tuple[dict[str, list[Setting]], dict[str, str]]:
    """Every component's settings in effect, and the components whose settings do not load."""
    found: dict[str, list[Setting]] = {}
    errors: dict[str, str] = {}
    for cls in settings_classes():
        try:
            found[cls.__name__] = effective(tree.get(cls))
        except ValidationError as exc:
            errors[cls.__name__] = _reasons(exc)
    return found, errors


def _reasons(exc: ValidationError) -> str:
    # Without the input: the value refused may be a secret.
    found = exc.errors(include_url=False, include_input=False)
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in found)


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) and value else json.dumps(value)


def _print_text(
    found: dict[str, list[Setting]], errors: dict[str, str], unknown: list[str]
) -> None:
    for component, rows in found.items():
        click.echo(f"[{component}]")
        for s in rows:
            click.echo(f"  {s.variable:<40} {_shown(s.value):<28} ({s.source})")
    for component, message in errors.items():
        click.echo(f"[{component}] does not load: {message}", err=True)
    if unknown:
        click.echo(problems_message([]).splitlines()[0], err=True)
        for name in unknown:
            click.echo(f"  {name}", err=True)
