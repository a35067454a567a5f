"""`ragwarm bench …`: benchmark commands, each in its own module, loaded on demand."""

from __future__ import annotations

import click

from ragwarm.cli import LazyGroup

BENCHES: dict[str, str] = {
    "engine": "ragwarm.bench_engine:engine",
    "rag": "ragwarm.bench_rag:rag",
    "pipeline": "ragwarm.bench_pipeline:pipeline",
    "strategies": "ragwarm.bench_strategies:strategies",
}


@click.group(cls=LazyGroup, targets=BENCHES)
def bench() -> None:
    """Benchmarks that print figures (add --json for one machine-readable object)."""
