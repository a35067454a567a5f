"""`ragwarm bench …`: benchmark commands, each in its own module, loaded on demand."""

from __future__ import annotations

import click

from ragwarm.cli import LazyGroup

BENCHES: dict[str, str] = {
    "engine": "ragwarm.bench.engine:engine",
    "rag": "ragwarm.bench.rag:rag",
    "pipeline": "ragwarm.bench.pipeline:pipeline",
    "strategies": "ragwarm.bench.strategies.command:strategies",
    "blend": "ragwarm.bench.blend_cli:blend",
    "faults": "ragwarm.bench.faults:faults",
    "contention": "ragwarm.bench.contention:contention",
    "kv-precision": "ragwarm.bench.kv_precision:kv_precision",
}


@click.group(cls=LazyGroup, targets=BENCHES)
def bench() -> None:
    """Benchmarks that print figures (add --json for one machine-readable object)."""
