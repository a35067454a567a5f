"""`ragwarm bench blend --calibrate`: the per-model quality gate of chunk-KV blending, measured
through the worker's own engine against the float32 full prefill and the bfloat16 floor."""

from __future__ import annotations

import copy
import datetime
import hashlib
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ragwarm.bench.blend import Case, _p50_ms, _progress, full_run, kl_divergence

if TYPE_CHECKING:
    import torch

    from workers.calibration import Calibration
    from workers.engines.torch_engine import TorchEngine

DEFAULT_CALIBRATION_SHARES = "0.15,0.3,0.5,0.7"
TENANT = "calibration"
COLD_TENANT = "calibration-cold"  # holds nothing: its prompts are cold prefills
GREEDY_TOKENS = 16


@dataclass(frozen=True)
class Compared:
    """One computation of a prompt against the float32 full prefill."""

    same_first: bool
    same_greedy: bool
    kl: float
    ttft_s: float = 0.0
    blended: int = 0


@dataclass
class Tally:
    """Every prompt's comparisons: the floor, and the blend per share; cold TTFTs."""

    floor: list[Compared] = field(default_factory=list)
    shares: dict[float, list[Compared]] = field(default_factory=dict)
    cold_s: list[float] = field(default_factory=list)
    # The same prompt on the warmed cache with blending off: the worker's answer without
    # chunk reuse (the first chunk's warmup is an exact prefix of it, `prefill_chunk`).
    exact_s: list[float] = field(default_factory=list)
    prompts: list[tuple[str, str]] = field(default_factory=list)  # (qid, prompt_sha)

    def rows(self) -> list[dict[str, Any]]:
        """Per question, its outcomes (floor, then the blend per share)."""
        def outcome(c: Compared) -> dict[str, Any]:
            return {"same_first": c.same_first, "same_greedy16": c.same_greedy,
                    "kl": round(c.kl, 7)}

        return [{"qid": qid, "prompt_sha": sha, "floor": outcome(self.floor[i]),
                 "blend": [outcome(rows[i]) for rows in self.shares.values()]}
                for i, (qid, sha) in enumerate(self.prompts)]


def prompt_sha(token_ids: Sequence[int]) -> str:
    """A short hash of a prompt's token ids (a re-run checks it measures the same prompt)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


class _Recorder:
    """The engine's ChunkBlender, keeping the last blended logits (for the KL)."""

    def __init__(self, blender: Any) -> None:
        self.blender = blender
        self.selection = blender.selection
        self.logits: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:  # the rest (its cost estimate) is the blender's
        return getattr(self.blender, name)

    def blend(self, request: Any, exact: Any, cached: int) -> Any:
        out = self.blender.blend(request, exact, cached)
        self.logits = None if out is None else out[0].logits
        return out


def compare(ref: tuple[torch.Tensor, list[int]], logits: torch.Tensor | None,
            tokens: Sequence[int], ttft_s: float = 0.0, blended: int = 0) -> Compared:
    """`tokens` (and the first-token `logits`) against the reference's. No logits: the prompt
    was computed exactly by the same float32 model (nothing to blend), so its KL is 0."""
    ref_logits, ref_tokens = ref
    kl = 0.0 if logits is None else kl_divergence(ref_logits, logits.float())
    return Compared(tokens[0] == ref_tokens[0], list(tokens) == list(ref_tokens), kl, ttft_s,
                    blended)


def quality(rows: Sequence[Compared]) -> dict[str, float]:
    n = len(rows) or 1
    return {
        "first_token_agreement": round(sum(r.same_first for r in rows) / n, 4),
        "greedy16_exact": round(sum(r.same_greedy for r in rows) / n, 4),
        "mean_kl_first_token": round(sum(r.kl for r in rows) / n, 6),
    }


def share_figures(share: float, rows: Sequence[Compared], cold_s: Sequence[float],
                  exact_s: Sequence[float] = ()) -> dict:
    """The figures of one share. `ttft_ratio` is against the cold full prefill (the gate's
    figure, as the issue states it); `ttft_vs_exact` against the same cache with blending
    off, which is what blending itself gains (the cold one also credits it with the exact
    hit the first chunk's warmup gives)."""
    full, blended = _p50_ms(cold_s), _p50_ms([r.ttft_s for r in rows])
    exact = _p50_ms(exact_s) if exact_s else None
    n = len(rows) or 1
    return {"recompute_share": share, **quality(rows), "ttft_full_ms_p50": full,
            "ttft_blend_ms_p50": blended, "ttft_ratio": round(blended / full, 4) if full else 0.0,
            "ttft_exact_ms_p50": exact,
            "ttft_vs_exact": round(blended / exact, 4) if exact else None,
            "blended_tokens_mean": round(sum(r.blended for r in rows) / n, 1)}


# -- running one prompt --------------------------------------------------------------------


def warm_chunks(engine: TorchEngine, case: Case) -> None:
    """Each chunk's KV as a chunk warmup stores it (`prefill_chunk`: `opening + chunk`)."""
    opening = case.token_ids[: case.opening]
    for key, ids in case.chunks:
        chunk_id, _, content_hash = key.rpartition("@")
        engine.prefill_chunk(opening, ids, tenant=TENANT, ref=(chunk_id, content_hash))


def spans(case: Case) -> list[Any]:
    from workers.kv.chunk_kv import ChunkSpan

    out, start = [], case.opening
    for key, ids in case.chunks:
        chunk_id, _, content_hash = key.rpartition("@")
        out.append(ChunkSpan((chunk_id, content_hash), start, start + len(ids)))
        start += len(ids)
    return out


def serve(engine: TorchEngine, case: Case, tenant: str, max_tokens: int, *,
          reuse: bool = True) -> Any:
    """The worker's generation of the prompt (greedy, no stop token), its final result."""
    from workers.engines.protocol import GenerateRequest

    steps = engine.generate(GenerateRequest(
        case.token_ids, max_tokens=max_tokens, tenant=tenant, stop_ids=(), chunks=spans(case),
        chunk_reuse=reuse and tenant != COLD_TENANT))
    return [step.result for step in steps][-1]


def run_case(engine: TorchEngine, models: dict[str, Any], case: Case,
             blenders: dict[float, Any], tally: Tally) -> None:
    """Reference, floor, one cold prefill, then the blend at every share, back to back (so
    load on the machine hits both sides of the TTFT ratio alike)."""
    tally.prompts.append((case.qid, prompt_sha(case.token_ids)))
    logits, tokens, _ = full_run(models["reference"], case)
    ref = (logits.float(), tokens)
    floor_logits, floor_tokens, _ = full_run(models["floor"], case)
    tally.floor.append(compare(ref, floor_logits, floor_tokens))
    tally.cold_s.append(serve(engine, case, COLD_TENANT, 1).ttft_s)
    warm_chunks(engine, case)
    tally.exact_s.append(serve(engine, case, TENANT, 1, reuse=False).ttft_s)
    for share, recorder in blenders.items():
        engine.chunks = recorder
        result = serve(engine, case, TENANT, GREEDY_TOKENS)
        tally.shares[share].append(
            compare(ref, recorder.logits, result.token_ids, result.ttft_s, result.blended_tokens)
        )


# -- provenance ----------------------------------------------------------------------------


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def code_commit() -> str:
    """The checkout's commit, `-dirty` when tracked files differ from it."""
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    return commit + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_name() -> str:
    """The CPU's model name, as the provenance's `machine` begins with it."""
    return next((line.split(":", 1)[1].strip() for line in _cpuinfo()
                 if line.startswith("model name")), platform.processor() or platform.machine())


def provenance(trace: Path, questions: int, threads: int, commit: str) -> dict[str, Any]:
    return {
        "command": shlex.join(["ragwarm", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, {threads} torch thread(s), "
                   f"{platform.system()} {platform.machine()}",
        "commit": commit,
        "trace": trace.name,
        "questions": questions,
        "packages": package_versions(),
    }


def package_versions() -> str:
    """The versions the figures depend on (the kernels of both dtypes, the model's loader)."""
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("torch", "transformers"))


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


# -- the command ---------------------------------------------------------------------------


def load_models(engine: TorchEngine) -> dict[str, Any]:
    """The float32 reference (the engine's own model where it is float32) and the floor."""
    import torch

    model = engine.model
    reference = model if model.dtype == torch.float32 else copy.deepcopy(model).float()
    return {"reference": reference,
            "floor": copy.deepcopy(reference).to(torch.bfloat16).eval()}


def calibrate(engine: TorchEngine, cases: Sequence[Case], shares: Sequence[float],
              method: str) -> Tally:
    from workers.engines.blend import Selection
    from workers.engines.chunk_reuse import ChunkBlender

    models = load_models(engine)
    # gate=False: every share is measured, never skipped by the worker's cost estimate.
    blenders = {s: _Recorder(ChunkBlender(engine, Selection(method=method, share=s), gate=False))
                for s in shares}
    tally = Tally(shares={s: [] for s in shares})
    for i, case in enumerate(cases, 1):
        run_case(engine, models, case, blenders, tally)
        _progress(f"[{i}/{len(cases)}] {case.qid}: {len(case.token_ids)} tokens, cold "
                  f"{tally.cold_s[-1] * 1000:.0f} ms; " + _brief(tally))
    return tally


def _brief(tally: Tally) -> str:
    floor = quality(tally.floor)
    parts = [f"floor {floor['first_token_agreement']:.2f}/{floor['greedy16_exact']:.2f}/"
             f"{floor['mean_kl_first_token']:.4f}"]
    for share, rows in tally.shares.items():
        f = share_figures(share, rows, tally.cold_s, tally.exact_s)
        parts.append(f"{share}: {f['first_token_agreement']:.2f}/{f['greedy16_exact']:.2f}/"
                     f"{f['mean_kl_first_token']:.4f}/{f['ttft_ratio']:.0%}")
    return ", ".join(parts)


def build_calibration(model_id: str, method: str, tally: Tally, origin: dict) -> Calibration:
    from workers.calibration import Floor, ShareFigures, choose_share, parse_calibration

    floor = Floor(**quality(tally.floor), dtype="bfloat16")
    rows = [ShareFigures(**share_figures(s, r, tally.cold_s, tally.exact_s))
            for s, r in tally.shares.items()]
    chosen = choose_share(floor, rows)
    return parse_calibration({
        "model_id": model_id, "selection": method, "passed": chosen is not None,
        "share": None if chosen is None else chosen.recompute_share,
        "ttft_ratio": None if chosen is None else chosen.ttft_ratio,
        "floor": floor.model_dump(), "shares": [r.model_dump() for r in rows],
        "provenance": origin, "questions": tally.rows(),
    })


def report(calibration: Calibration, out: Path) -> dict[str, Any]:
    """The JSON report: the gate, the floor, and per share its figures and missed criteria."""
    from workers.calibration import shortfalls

    c = calibration
    results = [{**s.model_dump(), "shortfalls": shortfalls(c.floor, s, c.max_mean_kl)}
               for s in c.shares]
    return {"gate": {"passed": c.passed, "share": c.share, "ttft_ratio": c.ttft_ratio},
            "model_id": c.model_id, "selection": c.selection, "max_mean_kl": c.max_mean_kl,
            "floor": c.floor.model_dump(), "results": results,
            "provenance": c.provenance.model_dump(), "calibration_out": str(out)}


def table(rep: dict[str, Any]) -> str:
    floor, gate = rep["floor"], rep["gate"]
    lines = [
        f"{rep['model_id']}, {rep['provenance']['questions']} questions, selection "
        f"{rep['selection']}; floor (bfloat16 vs float32): first token "
        f"{floor['first_token_agreement']:.3f}, greedy-16 {floor['greedy16_exact']:.3f}, "
        f"mean KL {floor['mean_kl_first_token']:.5f}",
        f"{'share':>6} {'first tok':>9} {'greedy16':>8} {'mean KL':>9} {'cold ms':>8} "
        f"{'blend ms':>8} {'ratio':>6} {'exact ms':>8} {'vs exact':>8}  gate",
    ]
    for r in rep["results"]:
        exact, vs = r.get("ttft_exact_ms_p50"), r.get("ttft_vs_exact")
        lines.append(
            f"{r['recompute_share']:>6.2f} {r['first_token_agreement']:>9.3f} "
            f"{r['greedy16_exact']:>8.3f} {r['mean_kl_first_token']:>9.5f} "
            f"{r['ttft_full_ms_p50']:>8.1f} {r['ttft_blend_ms_p50']:>8.1f} "
            f"{r['ttft_ratio']:>6.1%} {'-' if exact is None else f'{exact:.1f}':>8} "
            f"{'-' if vs is None else f'{vs:.1%}':>8}  {'; '.join(r['shortfalls']) or 'passes'}"
        )
    verdict = (f"gate passes at share {gate['share']} (TTFT {gate['ttft_ratio']:.1%} of full)"
               if gate["passed"] else "gate fails at every share: blending stays off")
    return "\n".join([*lines, verdict, f"calibration written to {rep['calibration_out']}"])


def write_calibration(calibration: Calibration, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(calibration.model_dump_json(indent=2) + "\n", encoding="utf-8")


def run_calibration(engine: TorchEngine, cases: Sequence[Case], shares: Sequence[float],
                    method: str, trace: Path, threads: int, out: Path | None) -> dict[str, Any]:
    """Measure, write the calibration (default: the repository's file for the model), and
    return the report."""
    from workers.calibration import calibration_path

    commit = code_commit()  # before the run: the code it measures, whatever changes meanwhile
    tally = calibrate(engine, cases, shares, method)
    origin = provenance(trace, len(cases), threads, commit)
    calibration = build_calibration(engine.model_id, method, tally, origin)
    out = out if out is not None else calibration_path(engine.model_id)
    try:
        write_calibration(calibration, out)
    except OSError as exc:
        raise click.ClickException(f"cannot write the calibration to {out}: {exc}") from None
    return report(calibration, out)
