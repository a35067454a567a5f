"""Per-policy figures computed from the measured per-query rows (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ragwarm.bench.stats import percentile
from ragwarm.bench.strategies.records import QueryRow as Row

# The `--json` contract of `ragwarm bench strategies`, per policy.
JSON_KEYS = (
    "ttft_p50_ms", "ttft_p99_ms", "hit_rate", "post_edit_hit_rate", "stale_hits",
    "kv_memory_share", "warmup_seconds",
)


def share(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else 0.0


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def reduction(value: float, baseline: float) -> float:
    """How much lower `value` is than `baseline`, as a share (0.65 = 65% lower)."""
    return 1.0 - value / baseline if baseline > 0 else 0.0


def policy_figures(rows: Sequence[Row], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Figures of one policy from its rows; `extra` holds what the worker counted."""
    ttfts = [r.ttft_ms for r in rows]
    post = [r for r in rows if r.post_edit]
    again = [r.ttft_ms for r in rows if r.repeat]
    prompt = sum(r.prompt_tokens for r in rows)
    return {
        "ttft_p50_ms": round(percentile(ttfts, 50), 2),
        "ttft_p99_ms": round(percentile(ttfts, 99), 2),
        "hit_rate": round(share(r.hit for r in rows), 4),
        "post_edit_hit_rate": round(share(r.hit for r in post), 4),
        "stale_hits": sum(r.stale for r in rows),
        "kv_memory_share": round(mean(r.mem_share for r in rows), 4),
        "warmup_seconds": round(float(extra.get("warmup_seconds", 0.0)), 2),
        "queries": len(rows),
        "repeat_queries": len(again),
        "repeat_ttft_p50_ms": round(percentile(again, 50), 2) if again else None,
        "repeat_ttft_p99_ms": round(percentile(again, 99), 2) if again else None,
        "post_edit_queries": len(post),
        "partial_hit_rate": round(share(r.partial for r in rows), 4),
        "cached_token_share": round(sum(r.cached_tokens for r in rows) / prompt, 4)
        if prompt else 0.0,
        "pinned_memory_share": round(mean(r.pinned_share for r in rows), 4),
        "outdated_partial_reuse": sum(r.outdated_partial for r in rows),
    }


def summarize(
    rows: Sequence[Row], extras: Mapping[str, Mapping[str, Any]], order: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Figures per policy in `order`, with P50/P99 reductions against `none` when present."""
    out = {name: policy_figures([r for r in rows if r.policy == name], extras.get(name, {}))
           for name in order}
    base = out.get("none")
    for figures in out.values():
        if base is not None:
            figures["p50_reduction"] = round(
                reduction(figures["ttft_p50_ms"], base["ttft_p50_ms"]), 4)
            figures["p99_reduction"] = round(
                reduction(figures["ttft_p99_ms"], base["ttft_p99_ms"]), 4)
    return out


def json_report(figures: Mapping[str, Mapping[str, Any]], queries: int, kb_events: int) -> dict:
    """Exactly the object `--json` prints."""
    return {
        "policies": {name: {k: f[k] for k in JSON_KEYS} for name, f in figures.items()},
        "queries": queries,
        "kb_events": kb_events,
    }


def hit_rate_series(rows: Sequence[Row], window: int) -> list[tuple[float, float]]:
    """Rolling hit rate over the last `window` queries of one policy: (time, rate) points."""
    out, hits = [], []
    for row in rows:
        hits.append(row.hit)
        recent = hits[-window:]
        out.append((row.at, sum(recent) / len(recent)))
    return out
