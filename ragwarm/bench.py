"""`ragwarm bench …`: benchmark commands, each in its own module, loaded on demand."""

from __future__ import annotations

import importlib

import click

BENCHES: dict[str, str] = {
    "engine": "ragwarm.bench_engine:engine",
    "rag": "ragwarm.bench_rag:rag",
    "pipeline": "ragwarm.bench_pipeline:pipeline",
    "strategies": "ragwarm.bench_strategies:strategies",
}


class _Benches(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(
            n for n, t in BENCHES.items() if importlib.util.find_spec(t.partition(":")[0])
        )

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = BENCHES.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_Benches)
def bench() -> None:
    """Benchmarks that print figures (add --json for one machine-readable object)."""
