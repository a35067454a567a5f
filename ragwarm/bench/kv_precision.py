"""`ragwarm bench kv-precision`: does storing cached KV in 16 bits, while computing in float32,
change what the model says?

A worker keeps a prompt's KV after computing it and serves later asks from it. Storing that KV
in float16 (or bfloat16) halves its bytes, so every budget would hold twice the prompts. The
question is whether the rest of a prompt, computed in float32 over the rounded KV, still gives
the float32 answer. Each real question's prompt is cut where a warm hit would cut it: after its
chunks (the question computed anew, as when a warmup held the prefix) and one token before its
end (the whole prompt held). The KV before the cut is rounded to the storage dtype and back,
the rest is computed over it, and the first token, the 16 greedy tokens and the first-token KL
are compared with the float32 full prefill. The bfloat16 model against float32 is printed
beside it: the model's own precision floor, the same one the blend gate uses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ragwarm.bench.blend import (
    DEFAULT_QUESTIONS,
    GREEDY_TOKENS,
    Case,
    _progress,
    full_run,
    greedy,
    kl_divergence,
    retrieve_cases,
)
from ragwarm.bench.engine import DEFAULT_EVENTS

if TYPE_CHECKING:
    import torch

    from workers.engines.blend import KV

STORAGE = ("float16", "bfloat16")
CUTS = ("prefix", "whole")  # after the chunks; one token before the prompt's end


@dataclass(frozen=True)
class Agreement:
    same_first: bool
    same_greedy: bool
    kl: float


def cut_at(case: Case, cut: str) -> int:
    """Tokens held in the cache before the rest is computed."""
    if cut == "prefix":
        return case.opening + sum(len(ids) for _, ids in case.chunks)
    return len(case.token_ids) - 1


def rounded(kv: KV, dtype: torch.dtype) -> KV:
    """The KV as a store in `dtype` gives it back: rounded, then float32 again."""
    return tuple((k.to(dtype).to(k.dtype), v.to(dtype).to(v.dtype)) for k, v in kv)


def stored_run(model: Any, case: Case, at: int, dtype: torch.dtype | None
               ) -> tuple[torch.Tensor, list[int]]:
    """First-token logits and greedy tokens when the first `at` tokens' KV was stored in
    `dtype` (None: kept as computed) and the rest is computed over it."""
    import torch

    from workers.engines.blend import prefill

    held, _ = prefill(model, case.token_ids[:at])
    if dtype is not None:
        held = rounded(held, dtype)
    rest, logits = prefill(model, case.token_ids[at:], held)
    kv = tuple((torch.cat((hk, rk), -2), torch.cat((hv, rv), -2))
               for (hk, hv), (rk, rv) in zip(held, rest, strict=True))
    return logits, greedy(model, kv, logits, GREEDY_TOKENS)


def agreement(ref: tuple[torch.Tensor, list[int]], logits: torch.Tensor,
              tokens: list[int]) -> Agreement:
    ref_logits, ref_tokens = ref
    return Agreement(tokens[0] == ref_tokens[0], tokens == ref_tokens,
                     kl_divergence(ref_logits, logits.float()))


def summary(rows: Sequence[Agreement]) -> dict[str, float]:
    n = len(rows) or 1
    return {"first_token_agreement": round(sum(r.same_first for r in rows) / n, 4),
            "greedy16_exact": round(sum(r.same_greedy for r in rows) / n, 4),
            "mean_kl_first_token": float(f"{sum(r.kl for r in rows) / n:.3g}"),
            "max_kl_first_token": float(f"{max((r.kl for r in rows), default=0.0):.3g}")}


def measure(model: Any, cases: Sequence[Case]) -> dict[str, Any]:
    """Per (storage dtype, cut), and for float32 storage (the split alone) and the bfloat16
    model, the agreement with the float32 full prefill."""
    import copy

    import torch

    floor_model = copy.deepcopy(model).to(torch.bfloat16).eval()
    dtypes: dict[str, torch.dtype | None] = {"float32": None}
    dtypes.update({name: getattr(torch, name) for name in STORAGE})
    rows: dict[str, list[Agreement]] = {f"{d}/{c}": [] for d in dtypes for c in CUTS}
    rows["floor"] = []
    for i, case in enumerate(cases, 1):
        logits, tokens, _ = full_run(model, case)
        ref = (logits.float(), tokens)
        f_logits, f_tokens, _ = full_run(floor_model, case)
        rows["floor"].append(agreement(ref, f_logits, f_tokens))
        for name, dtype in dtypes.items():
            for cut in CUTS:
                rows[f"{name}/{cut}"].append(
                    agreement(ref, *stored_run(model, case, cut_at(case, cut), dtype)))
        done = summary(rows["float16/prefix"])
        _progress(f"[{i}/{len(cases)}] {case.qid}: {len(case.token_ids)} tokens; float16 "
                  f"prefix so far {done['first_token_agreement']:.2f}/"
                  f"{done['greedy16_exact']:.2f}/{done['mean_kl_first_token']:.5f}")
    return {key: summary(value) for key, value in rows.items()}


def table(report: dict[str, Any]) -> str:
    lines = [f"{report['questions']} prompts (p50 {report['prompt_tokens_p50']} tokens), "
             "each against its float32 full prefill",
             "| KV stored in | cut | first token | greedy-16 | mean KL | max KL |",
             "|---|---|---:|---:|---:|---:|"]
    for key, fig in report["results"].items():
        name, _, cut = key.partition("/")
        label = ("bfloat16 model (the floor)", "whole prompt") if key == "floor" else (name, cut)
        lines.append(f"| {label[0]} | {label[1]} | {fig['first_token_agreement']:.3f} | "
                     f"{fig['greedy16_exact']:.3f} | {fig['mean_kl_first_token']:.2e} | "
                     f"{fig['max_kl_first_token']:.2e} |")
    return "\n".join(lines)


@click.command("kv-precision")
@click.option(
    "--events", "events_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_EVENTS, show_default=True, help="Trace events JSONL.",
)
@click.option(
    "--questions", "questions_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_QUESTIONS, show_default=True, help="Trace questions JSONL.",
)
@click.option("--questions-limit", type=int, default=None, help="Use only the first N questions.")
@click.option("--threads", type=int, default=None, help="torch threads (default: settings).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def kv_precision(events_path: Path, questions_path: Path, questions_limit: int | None,
                 threads: int | None, as_json: bool) -> None:
    """Agreement with float32 when cached KV is stored in float16 or bfloat16."""
    import statistics

    from ragwarm.models import ModelMissing, llm_dir
    from ragwarm.progress import waiting
    from workers.engines.torch_engine import load_torch_engine
    from workers.settings import WorkerSettings

    settings = WorkerSettings(threads=threads, chunk_reuse="off", dtype="float32")
    try:
        with waiting("loading the model"):
            engine = load_torch_engine(llm_dir(), settings)
    except ModelMissing as exc:
        raise click.ClickException(str(exc)) from None
    cases = retrieve_cases(events_path, questions_path, questions_limit, engine.tokenizer)
    if not cases:
        raise click.ClickException("no question retrieved any chunk")
    report = {"questions": len(cases),
              "prompt_tokens_p50": statistics.median(len(c.token_ids) for c in cases),
              "trace": events_path.parent.name, "greedy_tokens": GREEDY_TOKENS,
              "results": measure(engine.model, cases)}
    click.echo(json.dumps(report) if as_json else table(report))
