"""`ragwarm bench blend`: the command; it measures (`ragwarm.bench.blend`) or, with
--calibrate, writes the model's blend calibration (`ragwarm.bench.calibrate`)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import click

from ragwarm.bench.blend import (
    DEFAULT_QUESTIONS,
    DEFAULT_SHARES,
    Runner,
    _shares,
    _table,
    draw_curve,
    measure,
    retrieve_cases,
)
from ragwarm.bench.calibrate import DEFAULT_CALIBRATION_SHARES, run_calibration
from ragwarm.bench.calibrate import table as calibration_table
from ragwarm.bench.engine import DEFAULT_EVENTS


@click.command()
@click.option(
    "--events", "events_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_EVENTS, show_default=True, help="Trace events JSONL.",
)
@click.option(
    "--questions", "questions_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_QUESTIONS, show_default=True, help="Trace questions JSONL.",
)
@click.option("--recompute", default=None,
              help=f"Comma-separated shares of moved chunk tokens to recompute [default: "
              f"{DEFAULT_SHARES}; with --calibrate 0.15,0.3,0.5,0.7].")
@click.option("--questions-limit", type=int, default=None, help="Use only the first N questions.")
@click.option("--method", default=None,
              help="How recomputed tokens are chosen: hkvd, attn, sink, sink+hkvd, "
              "sink+attn, tail [default: the worker's RAGWARM_WORKER_CHUNK_SELECTION].")
@click.option("--checks", default="1,4,10", show_default=True,
              help="Layers where scored tokens are filtered (gradually, down to the share; "
              "--calibrate uses the worker's).")
@click.option("--widen", default=2.0, show_default=True,
              help="Kept share at the first check, as a multiple of the final share.")
@click.option("--bridge", type=int, default=0, show_default=True,
              help="Compute each chunk's KV after this many last tokens of the chunk before "
              "it in its document (0: after the system prompt alone).")
@click.option("--threads", type=int, default=None, help="torch threads (default: settings).")
@click.option("--chart", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the curve (quality and TTFT ratio per share) into this PNG.")
@click.option("--calibrate", is_flag=True,
              help="Measure the quality gate through the worker's engine (chunk KV as chunk "
              "warmup stores it, the worker's selection) against the float32 full prefill and "
              "the bfloat16 floor, and write the model's calibration.")
@click.option("--calibration-out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="With --calibrate: where to write the calibration [default: "
              "the repository's file for the model, workers/calibrations/<model>.json].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def blend(
    events_path: Path, questions_path: Path, recompute: str | None, questions_limit: int | None,
    method: str | None, checks: str, widen: float, bridge: int, threads: int | None,
    chart: Path | None, calibrate: bool, calibration_out: Path | None, as_json: bool,
) -> None:
    """First-token agreement, greedy agreement, KL and TTFT of chunk-KV reuse vs full prefill."""
    from ragwarm.models import ModelMissing, llm_dir
    from ragwarm.progress import waiting
    from workers.engines.blend import SELECTORS, prefill
    from workers.engines.torch_engine import load_torch_engine
    from workers.settings import WorkerSettings

    settings = WorkerSettings(threads=threads, chunk_reuse="off")
    method = method or settings.chunk_selection
    if method not in SELECTORS:
        raise click.BadParameter(f"valid methods: {', '.join(SELECTORS)}", param_hint="--method")
    if calibrate and bridge:
        raise click.BadParameter("the worker computes chunk KV after the system prompt alone",
                                 param_hint="--bridge")
    shares = _shares(recompute or (DEFAULT_CALIBRATION_SHARES if calibrate else DEFAULT_SHARES))
    try:
        with waiting("loading the model"):
            engine = load_torch_engine(llm_dir(), settings)
    except ModelMissing as exc:
        raise click.ClickException(str(exc)) from None
    cases = retrieve_cases(events_path, questions_path, questions_limit, engine.tokenizer)
    if not cases:
        raise click.ClickException("no question retrieved any chunk")
    if calibrate:
        rep = run_calibration(engine, cases, shares, method, events_path,
                              torch_threads(), calibration_out)
        click.echo(json.dumps(rep) if as_json else calibration_table(rep))
        return
    opening = cases[0].token_ids[: cases[0].opening]
    runner = Runner(engine.model, prefill(engine.model, opening)[0], opening, bridge)
    layers = tuple(int(c) for c in checks.split(","))
    results = measure(runner, cases, shares, method, layers, widen)
    report = {"questions": len(cases), "method": method, "checks": list(layers), "widen": widen,
              "bridge": bridge,
              "prompt_tokens_p50": statistics.median(len(c.token_ids) for c in cases),
              "results": results}
    if chart is not None:
        draw_curve(report, chart)
    click.echo(json.dumps(report) if as_json else _table(report))


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
