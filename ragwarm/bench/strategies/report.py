"""Outputs of `ragwarm bench strategies`: markdown table, CSV, per-query log and PNG charts."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ragwarm.bench.strategies.metrics import hit_rate_series
from ragwarm.bench.strategies.records import QueryRow

COLUMNS = (
    ("ttft_mean_ms", "TTFT mean ms", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("p50_reduction", "p50 vs none", "{:+.0%}"),
    ("ttft_p90_ms", "TTFT p90 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("p99_reduction", "p99 vs none", "{:+.0%}"),
    ("ttft_cvar90_ms", "tail mean (CVaR90) ms", "{:.0f}"),
    ("repeat_ttft_p99_ms", "p99 repeats ms", "{:.0f}"),
    ("hit_rate", "hit rate", "{:.0%}"),
    ("post_edit_hit_rate", "post-edit hit rate", "{:.0%}"),
    ("post_edit_queries", "post-edit queries", "{}"),
    ("stale_hits", "stale hits", "{}"),
    ("kv_memory_share", "KV memory share", "{:.0%}"),
    ("warmup_seconds", "warmup s", "{:.1f}"),
)


# First asks (nothing exact can be warm for them) and the blended answers' quality.
FIRST_ASK_COLUMNS = (
    ("first_ask_queries", "first asks", "{}"),
    ("first_ask_ttft_p50_ms", "first-ask TTFT p50 ms", "{:.0f}"),
    ("first_ask_ttft_p90_ms", "first-ask TTFT p90 ms", "{:.0f}"),
    ("first_ask_chunk_availability", "first-ask chunk KV held", "{:.0%}"),
    ("blended_queries", "blended answers", "{}"),
    ("blended_tokens", "blended tokens", "{}"),
    ("blended_token_share", "blended token share", "{:.0%}"),
    ("blended_first_token_agreement", "first token = exact", "{:.0%}"),
    ("blend_reuse_queries", "hits on stored blends", "{}"),
    ("blend_reuse_first_token_agreement", "their first token = exact", "{:.0%}"),
)

STYLES = ("-", "--", "-.", ":")


def markdown_table(figures: Mapping[str, Mapping[str, Any]],
                   columns: Sequence[tuple[str, str, str]] = COLUMNS) -> str:
    """One row per policy; reductions are shown as a change (-65% = 65% lower than none)."""
    head = "| policy | " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    lines = [head, rule]
    for name, f in figures.items():
        cells = [_cell(f, key, fmt) for key, _, fmt in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def policy_notes(figures: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per policy with figures of its own (`synthetic`: its KV share and how many
    first asks of a question hit a synthetic prefix)."""
    lines = []
    for name, f in figures.items():
        if f.get("synthetic_memory_share") is None:
            continue
        rate = f.get("synthetic_first_ask_hit_rate")
        lines.append(
            f"{name}: synthetic prefixes held {f['synthetic_memory_share']:.1%} of KV memory "
            f"on average (at most {f.get('synthetic_memory_share_max', 0.0):.1%}; cap 5%); "
            f"first asks that hit a synthetic prefix: "
            f"{'-' if rate is None else f'{rate:.0%}'} ({f.get('synthetic_first_hits', 0)} of "
            f"{f.get('first_asks', 0)}); {f.get('synthetic_requests', 0)} documents asked about, "
            f"{f.get('synthetic_questions', 0)} questions, "
            f"{f.get('synthetic_prefixes_warmed', 0)} prefixes warmed."
        )
    return lines


def tables(figures: Mapping[str, Mapping[str, Any]], estimated: bool = False) -> str:
    """The main table, then first asks and blended answers per policy; `estimated`: the
    TTFTs come from the cost model (a model-free run), and every TTFT column says so."""
    main, first = (_estimated(COLUMNS), _estimated(FIRST_ASK_COLUMNS)) if estimated \
        else (COLUMNS, FIRST_ASK_COLUMNS)
    return (markdown_table(figures, main) + "\n\nFirst asks and blended answers (chunk "
            "reuse):\n\n" + markdown_table(figures, first))


def _estimated(columns: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [(key, f"est. {title}" if "ms" in title or "vs none" in title else title, fmt)
            for key, title, fmt in columns]


def _cell(f: Mapping[str, Any], key: str, fmt: str) -> str:
    if f.get(key) is None:
        return "-"
    value = -f[key] if key.endswith("_reduction") else f[key]
    return fmt.format(value)


def write_outputs(
    out: Path,
    figures: Mapping[str, Mapping[str, Any]],
    rows: Sequence[QueryRow],
    kb_times: Sequence[float],
    header: str,
    sections: Sequence[str] = (),
    estimated: bool = False,
) -> list[Path]:
    """Write every output under `out` (`sections`: more markdown after the table;
    `estimated`: TTFTs from the cost model); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join([header, tables(figures, estimated), *sections]) + "\n"
    paths = [
        _write(out / "strategies.md", text),
        _write_csv(out / "strategies.csv", figures),
        _write(out / "queries.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in rows)),
    ]
    paths += charts(out, figures, rows, kb_times)
    return paths


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _write_csv(path: Path, figures: Mapping[str, Mapping[str, Any]]) -> Path:
    keys = sorted({k for f in figures.values() for k in f})
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", *keys])
        for name, f in figures.items():
            writer.writerow([name, *(f.get(k, "") for k in keys)])
    return path


def charts(
    out: Path,
    figures: Mapping[str, Mapping[str, Any]],
    rows: Sequence[QueryRow],
    kb_times: Sequence[float],
) -> list[Path]:
    """TTFT CDF per policy, and the rolling hit rate over time with KB edits marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy = {name: [r for r in rows if r.policy == name] for name in figures}
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, mine in by_policy.items():
        ttfts = sorted(r.ttft_ms for r in mine)
        if ttfts:
            ax.step(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post",
                    label=name)
    ax.set(xscale="log", xlabel="TTFT (ms, log scale)", ylabel="share of queries",
           title="TTFT CDF per policy")
    ax.legend()
    ax.grid(alpha=0.3)
    cdf = out / "ttft_cdf.png"
    fig.savefig(cdf, dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 5))
    for at in kb_times:
        ax.axvline(at / 60, color="grey", alpha=0.25, linewidth=1)
    for i, (name, mine) in enumerate(by_policy.items()):
        series = hit_rate_series(mine, window=10)
        # Policies often share a curve for a while; line styles keep each one visible.
        ax.plot([t / 60 for t, _ in series], [h for _, h in series], label=name,
                linestyle=STYLES[i % len(STYLES)], linewidth=1.6)
    ax.set(xlabel="simulated minutes (grey lines: KB edits)", ylabel="hit rate, last 10 queries",
           title="Prefix hit rate over time around KB edits", ylim=(-0.02, 1.02))
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(alpha=0.3)
    over_time = out / "hit_rate_over_time.png"
    fig.savefig(over_time, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [cdf, over_time]
