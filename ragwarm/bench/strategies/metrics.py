"""Per-policy figures computed from the measured per-query rows (pure)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ragwarm.bench.stats import percentile
from ragwarm.bench.strategies.records import QueryRow as Row

# The `--json` contract of `ragwarm bench strategies`, per policy.
JSON_KEYS = (
    "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_cvar90_ms", "hit_rate",
    "post_edit_hit_rate", "post_edit_queries", "first_ask_queries", "first_ask_ttft_p50_ms",
    "first_ask_ttft_p90_ms", "stale_hits", "kv_memory_share", "warmup_seconds",
    "first_ask_chunk_availability", "blended_queries", "blended_tokens",
    "blended_first_token_agreement", "blend_reuse_queries", "blend_reuse_first_token_agreement",
)
# Figures only some policies have (`Policy.figures`), in `--json` where they do.
POLICY_JSON_KEYS = (
    "synthetic_memory_share", "synthetic_memory_share_max", "synthetic_first_ask_hit_rate",
)


def share(flags: Iterable[bool]) -> float | None:
    """The share of true flags; None (absent, not 0) when there are none."""
    flags = list(flags)
    return round(sum(flags) / len(flags), 4) if flags else None


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def pct(values: Sequence[float], q: float) -> float | None:
    """`percentile` rounded for the report; None when there are no values."""
    return round(percentile(values, q), 2) if values else None


def cvar(values: Sequence[float], q: float = 90) -> float | None:
    """The tail mean: the mean of the slowest (100 - q)% of `values` (at least one value).

    Steadier than one percentile on a few hundred queries: every tail query counts, so a
    single noisy measurement moves it by a fraction instead of deciding it.
    """
    if not values:
        return None
    tail = sorted(values)[int(len(values) * q / 100):] or [max(values)]
    return round(mean(tail), 2)


def reduction(value: float | None, baseline: float | None) -> float | None:
    """How much lower `value` is than `baseline`, as a share (0.65 = 65% lower)."""
    if value is None or baseline is None or baseline <= 0:
        return None
    return round(1.0 - value / baseline, 4)


def policy_figures(rows: Sequence[Row], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Figures of one policy from its rows; `extra` holds what the worker counted."""
    ttfts = [r.ttft_ms for r in rows]
    post = [r for r in rows if r.post_edit]
    again = [r.ttft_ms for r in rows if r.repeat]
    prompt = sum(r.prompt_tokens for r in rows)
    return {
        "ttft_mean_ms": round(mean(ttfts), 2) if ttfts else None,
        "ttft_p50_ms": pct(ttfts, 50),
        "ttft_p90_ms": pct(ttfts, 90),
        "ttft_p99_ms": pct(ttfts, 99),
        "ttft_cvar90_ms": cvar(ttfts, 90),
        "hit_rate": share(r.hit for r in rows),
        "post_edit_hit_rate": share(r.hit for r in post),
        "stale_hits": sum(r.stale for r in rows),
        "kv_memory_share": round(mean(r.mem_share for r in rows), 4),
        "warmup_seconds": round(float(extra.get("warmup_seconds", 0.0)), 2),
        "queries": len(rows),
        "repeat_queries": len(again),
        "repeat_ttft_p50_ms": pct(again, 50),
        "repeat_ttft_p99_ms": pct(again, 99),
        "post_edit_queries": len(post),
        "partial_hit_rate": share(r.partial for r in rows),
        "cached_token_share": round(sum(r.cached_tokens for r in rows) / prompt, 4)
        if prompt else None,
        "pinned_memory_share": round(mean(r.pinned_share for r in rows), 4),
        "outdated_partial_reuse": sum(r.outdated_partial for r in rows),
        "disk_share": _disk_share(rows),
        "restored_queries": sum(r.restored for r in rows),
        **first_ask_figures(rows),
    } | dict(extra.get("figures", {}))


def first_ask_figures(rows: Sequence[Row]) -> dict[str, Any]:
    """First asks (the question's first time in the run: no exact prefix can be warm for
    it unless a warmup guessed it) and the quality of blended answers, whose first token is
    checked against the exact computation's."""
    first = [r for r in rows if not r.repeat]
    blended = [r for r in rows if r.blended_tokens]
    # Hits on a blended answer stored earlier: approximate KV too, checked the same way.
    reused = [r for r in rows if r.approx_cached_tokens and not r.blended_tokens]
    chunk_tokens = sum(r.chunk_tokens for r in first)
    return {
        "first_ask_queries": len(first),
        "first_ask_ttft_p50_ms": pct([r.ttft_ms for r in first], 50),
        "first_ask_ttft_p90_ms": pct([r.ttft_ms for r in first], 90),
        # Of first asks' chunk tokens past their exact prefix, the share some stored prompt
        # held (chunk KV a blend could use, whether this policy blends or not).
        "first_ask_chunk_availability": round(
            sum(r.chunk_tokens_held for r in first) / chunk_tokens, 4) if chunk_tokens else None,
        "blended_queries": len(blended),
        "blended_tokens": sum(r.blended_tokens for r in blended),
        "blended_first_token_agreement": share(
            bool(r.first_token_agrees) for r in blended if r.first_token_agrees is not None
        ),
        "blend_reuse_queries": len(reused),
        "blend_reuse_first_token_agreement": share(
            bool(r.first_token_agrees) for r in reused if r.first_token_agrees is not None
        ),
        "blended_token_share": round(sum(r.blended_tokens for r in blended)
                                     / sum(r.prompt_tokens for r in blended), 4)
        if blended else None,
    }


def _disk_share(rows: Sequence[Row]) -> float | None:
    """Mean disk tier bytes over the device KV budget; None for a policy without a tier."""
    shares = [r.disk_share for r in rows if r.disk_share is not None]
    return round(mean(shares), 4) if shares else None


def summarize(
    rows: Sequence[Row], extras: Mapping[str, Mapping[str, Any]], order: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Figures per policy in `order`, with P50/P99 reductions against `none` when present."""
    out = {name: policy_figures([r for r in rows if r.policy == name], extras.get(name, {}))
           for name in order}
    base = out.get("none")
    for figures in out.values():
        if base is not None:
            for q in (50, 90, 99):
                key = f"ttft_p{q}_ms"
                figures[f"p{q}_reduction"] = reduction(figures[key], base[key])
    return out


def median_figures(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per policy, the median of each numeric figure over `runs` (one `summarize` each);
    a figure some runs lack (None) is the median of those that have it. Other values (text,
    flags, nested parts) are the first run's."""
    out: dict[str, dict[str, Any]] = {}
    for name, first in runs[0].items():
        merged = dict(first)
        for key in first:
            values = [r[name].get(key) for r in runs if name in r]
            numbers = [v for v in values
                       if isinstance(v, int | float) and not isinstance(v, bool)]
            if numbers:
                merged[key] = round(statistics.median(numbers), 4)
        out[name] = merged
    return out


def json_report(figures: Mapping[str, Mapping[str, Any]], queries: int, kb_events: int,
                measurements: int | None = None, **sections: Any) -> dict:
    """Exactly the object `--json` prints; `measurements`: distinct TTFT measurements made
    (policies whose request was the same computation share one); `sections`: further
    parts of the report (the seed table, the restart scenario), None ones left out."""
    report = {
        "policies": {
            name: {k: f[k] for k in (*JSON_KEYS, *POLICY_JSON_KEYS) if k in f or k in JSON_KEYS}
            for name, f in figures.items()
        },
        "queries": queries,
        "kb_events": kb_events,
    }
    if measurements is not None:
        report["measurements"] = measurements
    report |= {k: v for k, v in sections.items() if v is not None}
    return report


def hit_rate_series(rows: Sequence[Row], window: int) -> list[tuple[float, float]]:
    """Rolling hit rate over the last `window` queries of one policy: (time, rate) points."""
    out, hits = [], []
    for row in rows:
        hits.append(row.hit)
        recent = hits[-window:]
        out.append((row.at, sum(recent) / len(recent)))
    return out
