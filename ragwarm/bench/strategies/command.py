"""`ragwarm bench strategies`: every warmup policy on one real KB history, side by side."""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ragwarm.settings import TRACE_DIR
from ragwarm.trace import TraceError, read_events, read_questions

_PATH = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command()
@click.option("--events", "events_path", default=TRACE_DIR / "events.jsonl", show_default=True,
              type=_PATH, help="Trace events JSONL (the trace format of the data README; "
              "`ragwarm trace from-git` builds one from your own documentation's history).")
@click.option("--questions", "questions_path", default=None, type=_PATH,
              help="Trace questions JSONL.  [default: questions.jsonl beside --events]")
@click.option("--seed", type=int, default=None, help="Workload seed (RAGWARM_STRATEGIES_SEED).")
@click.option("--quick", is_flag=True,
              help="A slice: 40 sampled questions, their documents (50 with distractors), "
              "10 relevant edits, 72 short queries (under 15 min).")
@click.option("--standard", is_flag=True,
              help="The whole initial state, default chunks, 240 queries, 30 content-changing "
              "edits; a repeated computation is measured once (13-15 min for seven "
              "policies on 2 CPU cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (figures only).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("out/strategies"), show_default=True,
              help="Folder for the table, CSV, per-query log and charts.")
@click.option("--policies", default=None,
              help="Comma-separated subset of policies (default: all; `none` is the baseline).")
@click.option("--queries", type=int, default=None, help="Override the number of queries.")
@click.option("--edits", type=int, default=None, help="Override the number of KB changes.")
@click.option("--restart-at", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None, metavar="FRACTION",
              help="Restart scenario: every worker restarts (device cache lost, disk kept) "
              "before the query at this share of the run (RAGWARM_STRATEGIES_RESTART_AT).")
@click.option("--memory-share", type=click.FloatRange(0, 4, min_open=True), default=None,
              metavar="FRACTION",
              help="Every policy's KV budget, as a share of the bytes of the live questions' "
              "distinct top-3 prefixes (RAGWARM_STRATEGIES_MEMORY_SHARE, default 0.4): "
              "compare the policies at another budget.")
@click.option("--model-free", is_flag=True,
              help="Workers on the cost engine (same cache bookkeeping, no forward pass): "
              "hits exact, TTFT estimated by the fitted cost model; minutes, not half an "
              "hour. Policies needing tensors or the model's text are left out.")
@click.option("--runs", type=click.IntRange(1), default=1, show_default=True,
              help="Repeat with N workload seeds (the seed, seed+1, ...) and report the "
              "median of each figure; each run's outputs go to OUT/seed-<seed>/.")
@click.option("--drawn", is_flag=True,
              help="The workload as drawn, without the post-edit scenario's moved asks "
              "(every edit followed by an ask it concerns); RAGWARM_STRATEGIES_POST_EDIT_ASKS.")
def strategies(
    events_path: Path, questions_path: Path | None, seed: int | None, quick: bool, standard: bool,
    as_json: bool, out: Path, policies: str | None, queries: int | None, edits: int | None,
    restart_at: float | None, memory_share: float | None, model_free: bool, runs: int,
    drawn: bool,
) -> None:
    """Replay a KB history with a Zipf query workload under every warmup policy, for real:
    real retrieval on Qdrant, real prefill and TTFT on the torch engine, one simulated clock.
    """
    from ragwarm.bench.strategies.settings import StrategySettings

    if quick and standard:
        raise click.UsageError("give at most one of --quick and --standard")
    given: dict[str, Any] = {
        k: v for k, v in (("seed", seed), ("restart_at", restart_at),
                          ("memory_share", memory_share)) if v is not None}
    if drawn:
        given["post_edit_asks"] = False
    settings = StrategySettings(**given)
    names = _names(policies, model_free)
    questions_path = questions_path or events_path.with_name("questions.jsonl")
    if not questions_path.is_file():
        raise click.UsageError(f"no questions beside {events_path}: pass --questions FILE")
    try:
        events = list(read_events(events_path))
        questions = read_questions(questions_path)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    plan = _plan(settings, "quick" if quick else "standard" if standard else "full", queries,
                 edits) | {"model_free": model_free}
    if (notice := full_mode_notice(plan, len(names))) is not None:
        click.echo(notice, err=True)
    # Commands are counted per outcome in run.json; one log line each would drown the bars.
    logging.getLogger("workers").setLevel(logging.ERROR)
    load_before = os.getloadavg()
    if runs == 1:
        result = _run(events, questions, settings, names, plan)
        _finish(result, names, out, as_json, plan, load_before)
        return
    seeds = [settings.seed + i for i in range(runs)]
    results = [_seeded_run(events, questions, settings.model_copy(update={"seed": seed}),
                           names, plan, out, f"run {i + 1}/{runs}")
               for i, seed in enumerate(seeds)]
    _finish_runs(results, seeds, names, out, as_json, plan, load_before)


def _seeded_run(events: list, questions: list, settings: Any, names: list[str], plan: dict,
                out: Path, label: str) -> Any:
    """One run of `--runs`: the workload drawn with its own seed, outputs in their folder."""
    click.echo(f"{label}: workload seed {settings.seed}", err=True)
    load_before = os.getloadavg()
    result = _run(events, questions, settings, names, plan)
    _write(result, names, out / f"seed-{settings.seed}", plan, load_before)
    return result


def _finish_runs(results: list, seeds: list[int], names: list[str], out: Path, as_json: bool,
                 plan: dict, load_before: tuple[float, float, float]) -> None:
    """The median of each figure over the runs: the table, run.json and `--json`."""
    from ragwarm.bench.strategies.metrics import json_report, median_figures, summarize
    from ragwarm.bench.strategies.report import tables

    figures = median_figures([summarize(r.rows, r.policies, names) for r in results])
    first, machine = results[0], _machine(load_before)
    header = (_header(first, plan, machine) + f" **Median of {len(results)} runs** "
              f"(workload seeds {', '.join(map(str, seeds))}; each run in OUT/seed-<seed>/).")
    cost = first.meta.get("ttft_estimated")
    text = header + "\n\n" + tables(figures, cost is not None) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "strategies.md").write_text(text, encoding="utf-8")
    report = json_report(figures, first.queries, first.kb_events, ttft_estimated=cost,
                         kv_budget=_kv_budget(first.meta), runs=len(results), seeds=seeds)
    (out / "run.json").write_text(json.dumps({"median": report, "plan": plan,
                                              "machine": machine}, indent=2) + "\n",
                                  encoding="utf-8")
    click.echo(json.dumps(report) if as_json else text + f"\nwritten: {out}/strategies.md, "
               f"{out}/run.json, and each run under {out}/seed-<seed>/")


def _names(policies: str | None, model_free: bool = False) -> list[str]:
    from ragwarm.bench.strategies.policies import model_free as runs_model_free
    from ragwarm.bench.strategies.policies import policy_class, policy_names

    if policies is None:
        names = policy_names()
        return [n for n in names if runs_model_free(policy_class(n))] if model_free else names
    names = [n.strip() for n in policies.split(",") if n.strip()]
    try:
        for name in names:
            if not runs_model_free(policy_class(name)) and model_free:
                raise ValueError(f"policy {name!r} needs the model (disk tier, chunk KV or "
                                 "sampled text): run it without --model-free")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--policies") from None
    return names


def full_mode_notice(plan: dict[str, Any], n_policies: int) -> str | None:
    """What the default (full) mode costs with the model, said before the hours start: it
    is what a user runs first. None for the other modes and model-free runs."""
    if plan["mode"] != "full" or plan.get("model_free"):
        return None
    edits = "every relevant KB change" if plan["edits"] is None else f"{plan['edits']} KB changes"
    return (f"full mode: {plan['queries']} queries and {edits} of the trace under "
            f"{n_policies} policies, each request measured on the model; on a few CPU cores "
            "this takes hours. --standard (240 queries, a repeated computation measured once) "
            "and --quick are shorter; --model-free replays this workload in minutes, TTFT "
            "estimated.")


def _plan(settings: Any, mode: str, queries: int | None, edits: int | None) -> dict[str, Any]:
    """The workload's size per mode: quick (a sampled slice), standard, full."""
    from rag.settings import RagSettings

    chunk = settings.chunk_tokens or (
        settings.quick_chunk_tokens if mode == "quick" else RagSettings().chunk_tokens)
    sizes = {
        "quick": (settings.quick_queries, settings.quick_edits),
        "standard": (settings.standard_queries, settings.standard_edits),
        "full": (settings.queries, settings.edits),
    }[mode]
    return {
        "mode": mode,
        "quick": mode == "quick",
        "queries": queries or sizes[0],
        "edits": edits if edits is not None else sizes[1],
        "chunk_tokens": chunk,
        "docs": settings.quick_docs if mode == "quick" else None,
        "sample": settings.quick_questions if mode == "quick" else None,
        # An hour on 2 cores only if a repeated prompt is not re-measured at every ask.
        "share_queries": mode == "standard" and settings.standard_share_queries,
    }


def _run(events: list, questions: list, settings: Any, names: list[str], plan: dict) -> Any:
    from ragwarm.bench.strategies.runner import open_rig, run_benchmark
    from ragwarm.models import ModelMissing
    from ragwarm.settings import ModelSettings
    from workers.cost_engine import DEFAULT_COST, CostModel, calibrated_share

    share = calibrated_share(ModelSettings().llm_name)
    cost = CostModel(*DEFAULT_COST).for_share(share) if plan["model_free"] else None
    with tempfile.TemporaryDirectory(prefix="ragwarm-strategies-") as tmp:
        try:
            rig = open_rig(settings, Path(tmp) / "store", plan["chunk_tokens"], cost)
        except ModelMissing as exc:
            raise click.ClickException(str(exc)) from None
        try:
            result = run_benchmark(events, questions, settings, rig, edits=plan["edits"],
                                   queries=plan["queries"], docs=plan["docs"],
                                   sample=plan["sample"], names=names,
                                   tier_root=Path(tmp) / "kv-tier",
                                   share_queries=plan["share_queries"])
            if cost is not None:
                result.meta["ttft_estimated"] = {
                    "fixed_ms": cost.fixed_ms, "per_token_ms": cost.per_token_ms,
                    "recompute_share": cost.recompute_share,
                    "moved_token_cost": round(cost.moved_share, 4)}
            return result
        finally:
            rig.store.close()


def _write(result: Any, names: list[str], out: Path, plan: dict,
           load_before: tuple[float, float, float]) -> tuple[dict, str, dict, list]:
    """One run's table, CSV, per-query log, charts and run.json under `out`."""
    from ragwarm.bench.strategies.metrics import summarize
    from ragwarm.bench.strategies.report import write_outputs

    figures = summarize(result.rows, result.policies, names)
    machine = _machine(load_before)
    header = _header(result, plan, machine)
    seed, restart, sections = _sections(result, figures)
    cost = result.meta.get("ttft_estimated")  # a model-free run: no TTFT was measured
    paths = write_outputs(out, figures, result.rows, result.kb_times, header, sections,
                          estimated=cost is not None)
    run = {"figures": figures, "policies": result.policies, "meta": result.meta, "plan": plan,
           "machine": machine, "queries": result.queries, "kb_events": result.kb_events,
           "seed_table": seed, "restart": restart}
    (out / "run.json").write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
    return figures, header, {"seed": seed, "restart": restart, "sections": sections,
                             "cost": cost}, paths


def _finish(result: Any, names: list[str], out: Path, as_json: bool, plan: dict,
            load_before: tuple[float, float, float]) -> None:
    from ragwarm.bench.strategies.metrics import json_report
    from ragwarm.bench.strategies.report import policy_notes, tables

    figures, header, parts, paths = _write(result, names, out, plan, load_before)
    seed, restart, sections, cost = (parts["seed"], parts["restart"], parts["sections"],
                                     parts["cost"])
    if as_json:
        click.echo(json.dumps(json_report(figures, result.queries, result.kb_events,
                                          result.meta.get("measurements"), seed_table=seed,
                                          restart=restart, ttft_estimated=cost,
                                          kv_budget=_kv_budget(result.meta))))
        return
    click.echo("\n\n".join([header, tables(figures, cost is not None), *sections,
                             *policy_notes(figures)]))
    click.echo("\nwritten: " + ", ".join(str(p) for p in [*paths, out / "run.json"]))


def _kv_budget(meta: dict) -> dict[str, Any]:
    """The one budget every policy ran under: a policy's figures mean little without it."""
    keys = ("memory_share", "budget_bytes", "distinct_prefix_bytes", "host_tier_bytes")
    return {k: meta[k] for k in keys if k in meta}


def _sections(result: Any, figures: dict) -> tuple[list, dict | None, list[str]]:
    """Seed 000's table beside ours, and the restart scenario's figures when it ran: as
    data (for JSON) and as markdown sections."""
    from ragwarm.bench.strategies.restart import restart_figures, restart_markdown
    from ragwarm.bench.strategies.seedtable import seed_markdown, seed_rows

    seed = seed_rows(figures)
    sections = ["Seed 000's strategy table beside ours (memory share: of each policy's KV "
                "budget, mean over queries; P99 change vs `none`; warmup s: prefill time of "
                "warmup commands):\n\n" + seed_markdown(seed)]
    info = result.meta.get("restart")
    if info is None:
        return seed, None, sections
    per_policy = restart_figures(result.rows, info["boots"], info["window"])
    restart = {"at_s": info["at_s"], "window": info["window"], "policies": per_policy}
    sections.append(restart_markdown(per_policy, info["window"], info["at_s"]))
    return seed, restart, sections


def _machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpus": os.cpu_count(), "gpu": gpu, "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "load_avg": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _header(result: Any, plan: dict, machine: dict) -> str:
    meta = result.meta
    gpu = machine["gpu"] or "no GPU"
    return (
        f"`{_command()}`\n\n"
        f"{machine['date']}: {machine['cpus']} CPUs, {gpu}, {machine['torch_threads']} torch "
        f"thread(s), load average {machine['load_avg'][0]} -> {machine['load_avg'][1]}. "
        f"{result.queries} queries, {result.kb_events} KB changes over "
        f"{meta['duration_sim_s'] / 60:.0f} simulated minutes; chunks of "
        f"{plan['chunk_tokens']} tokens; KV budget {meta['budget_bytes'] / 2**20:.0f} MiB per "
        f"policy ({meta['memory_share']:g} of {meta['distinct_prefix_bytes'] / 2**20:.0f} MiB "
        f"of distinct initial prefixes; a host KV tier of "
        f"{meta.get('host_tier_bytes', 0) / 2**20:.0f} MiB for the policies keeping the "
        f"worker's default one); {meta['initial_docs']} documents, "
        f"{meta['questions']} questions; "
        f"{meta['measurements']} distinct measurements for {meta['requests']} requests"
        f"{' (shared across queries)' if meta.get('shared_across_queries') else ''}; "
        f"ran {meta['elapsed_seconds'] / 60:.1f} min." + _estimate_note(meta)
    )


def _estimate_note(meta: dict) -> str:
    cost = meta.get("ttft_estimated")
    if cost is None:
        return ""
    blend = ""
    if "recompute_share" in cost:  # a blend, where the worker's own estimate would run one
        blend = (f"; a blend at share {cost['recompute_share']} pays "
                 f"{cost['moved_token_cost']:.2f} of a token per moved token")
    return (f" **Model-free: hits exact, every TTFT estimated** ({cost['fixed_ms']:.0f} ms + "
            f"{cost['per_token_ms']:.2f} ms per uncached prompt token{blend}), not measured.")


def _command() -> str:
    tail = sys.argv[sys.argv.index("strategies") + 1:] if "strategies" in sys.argv else []
    return "ragwarm bench strategies " + " ".join(shlex.quote(a) for a in tail)
