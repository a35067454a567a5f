"""The restart scenario's plan and figures (pure): every worker restarts at one point of the
timeline, on the same disk; how each policy serves the queries right after it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ragwarm.bench.strategies import workload as wl
from ragwarm.bench.strategies.metrics import pct, share
from ragwarm.bench.strategies.records import QueryRow


def restart_step(steps: Sequence[wl.Step], fraction: float | None) -> int | None:
    """Index in `steps` of the query the restarted workers answer first: the query at
    `fraction` of the run's queries (rounded, at least the second: a restart before any
    query is a cold start). None without a fraction, or with fewer than two queries."""
    if fraction is None:
        return None
    if not 0 < fraction < 1:
        raise ValueError(f"restart fraction must be in (0, 1), got {fraction}")
    queries = [i for i, s in enumerate(steps) if isinstance(s, wl.QueryStep)]
    if len(queries) < 2:
        return None
    ordinal = min(max(1, round(fraction * len(queries))), len(queries) - 1)
    return queries[ordinal]


def restart_figures(
    rows: Sequence[QueryRow], boots: Mapping[str, Mapping[str, Any]], window: int
) -> dict[str, dict[str, Any]]:
    """Per policy: the first `window` queries after the restart (TTFT, hits), the same
    number just before it, and what its boot did (`boots`: re-warm seconds, disk blocks)."""
    out: dict[str, dict[str, Any]] = {}
    for name, boot in boots.items():
        mine = [r for r in rows if r.policy == name]
        after = [r for r in mine if r.since_restart is not None][:window]
        before = [r for r in mine if r.since_restart is None][-window:]
        out[name] = {
            "queries_after": len(after),
            "ttft_p50_ms_after": pct([r.ttft_ms for r in after], 50),
            "ttft_max_ms_after": max((round(r.ttft_ms, 2) for r in after), default=None),
            "hit_rate_after": share(r.hit for r in after),
            "hit_rate_before": share(r.hit for r in before),
            "cached_tokens_after": sum(r.cached_tokens for r in after),
            "restored_hits_after": sum(r.restored for r in after),
            "stale_hits_after": sum(r.stale for r in after),
            **dict(boot),
        }
    return out


def restart_markdown(figures: Mapping[str, Mapping[str, Any]], window: int, at: float) -> str:
    """The restart table: one row per policy."""
    after = max((f.get("queries_after") or 0 for f in figures.values()), default=0)
    lines = [
        f"Restart at {at / 60:.1f} simulated minutes (every worker, same disk); the first "
        f"{after} queries after it (window {window}) and as many before it:",
        "",
        "| policy | disk blocks at boot | re-warm s | hit rate before | hit rate after "
        "| TTFT p50 ms after | TTFT max ms after | restored hits | stale hits after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in figures.items():
        cells = [
            f.get("tier_blocks"), _fmt(f.get("rewarm_seconds"), "{:.1f}"),
            _fmt(f.get("hit_rate_before"), "{:.0%}"), _fmt(f.get("hit_rate_after"), "{:.0%}"),
            _fmt(f.get("ttft_p50_ms_after"), "{:.0f}"), _fmt(f.get("ttft_max_ms_after"), "{:.0f}"),
            f.get("restored_hits_after"), f.get("stale_hits_after"),
        ]
        lines.append(f"| {name} | " + " | ".join("-" if c is None else str(c) for c in cells)
                     + " |")
    return "\n".join(lines)


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
