"""Seed 000's strategy table beside ours: memory share, P99 change and warmup time (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SeedRow:
    """One row of seed 000's table (DeepSeek-V2 7B, 4×A10G, vLLM 0.2.5), and our policy
    that implements its strategy."""

    strategy: str
    policy: str
    memory_share: tuple[float, float]  # low and high end of the range it gives
    memory_text: str
    p99_change: float  # -0.82 = 82% lower
    warmup_s: float
    use: str


SEED_000 = (
    SeedRow("full prefill of historical conversations", "history", (1.0, 1.0), "100%", -0.82,
            120, "fixed-KB QA"),
    SeedRow("dynamic hot-token", "hot-tokens", (0.15, 0.20), "15–20%", -0.65, 30,
            "multi-tenant gateway"),
    SeedRow("batched synthetic requests", "synthetic", (0.0, 0.05), "<5%", -0.48, 5,
            "burst buffer"),
    SeedRow("hybrid", "hybrid", (0.30, 0.40), "30–40%", -0.73, 45, "general"),
    SeedRow("tiered KV cache", "tiered", (0.50, 0.50), "50%", -0.68, 60, "long context"),
)


def seed_rows(figures: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy that ran (in run order), then the seed's strategies whose policy
    did not run; ours (None where not run) beside the seed's (None where it has no row)."""
    by_policy = {s.policy: s for s in SEED_000}
    rows = [_row(name, f, by_policy.get(name)) for name, f in figures.items()]
    rows += [_row(s.policy, None, s) for s in SEED_000 if s.policy not in figures]
    return rows


def _row(policy: str, f: Mapping[str, Any] | None, seed: SeedRow | None) -> dict[str, Any]:
    reduction = f.get("p99_reduction") if f is not None else None
    return {
        "strategy": seed.strategy if seed is not None else None,
        "policy": policy,
        "ran": f is not None,
        "memory_share": f.get("kv_memory_share") if f is not None else None,
        # Disk is not device memory: a tier below it is shown apart, never added in.
        "disk_share": f.get("disk_share") if f is not None else None,
        "p99_change": -reduction if reduction is not None else None,
        "warmup_s": f.get("warmup_seconds") if f is not None else None,
        "seed_memory_share": list(seed.memory_share) if seed is not None else None,
        "seed_memory_text": seed.memory_text if seed is not None else None,
        "seed_p99_change": seed.p99_change if seed is not None else None,
        "seed_warmup_s": seed.warmup_s if seed is not None else None,
        "seed_use": seed.use if seed is not None else None,
    }


def seed_markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as seed 000 lays its table out, each of our figures beside the seed's."""
    lines = [
        "| strategy (seed 000) | policy | memory share | seed | P99 change vs none | seed "
        "| warmup s | seed | use (seed) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        cells = [
            r["strategy"] or "-",
            r["policy"] if r["ran"] else f"{r['policy']} (not run)",
            _memory(r),
            r["seed_memory_text"] or "-",
            _fmt(r["p99_change"], "{:+.0%}"),
            _fmt(r["seed_p99_change"], "{:+.0%}"),
            _fmt(r["warmup_s"], "{:.1f}"),
            _fmt(r["seed_warmup_s"], "{:.0f}"),
            r["seed_use"] or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _memory(r: Mapping[str, Any]) -> str:
    device = _fmt(r["memory_share"], "{:.0%}")
    if r["disk_share"] is None:
        return device
    return f"{device} + {r['disk_share']:.0%} disk"


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
