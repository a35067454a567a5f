"""`ragwarm bench contention`: a request's TTFT while its worker prefills a burst of
warmups, under each engine lock (real model, torch engine on the CPU)."""

from __future__ import annotations

import pytest

from ragwarm.models import fetch_llm

pytestmark = pytest.mark.integration


def test_bench_contention_reports_both_locks() -> None:
    import json

    from click.testing import CliRunner

    from ragwarm.bench.contention import LOCKS, SATURATED_LOCKS, contention

    fetch_llm()
    args = ["--runs", "1", "--burst", "2", "--prefix", "64", "--question", "8", "--json",
            "--device", "cpu"]
    done = CliRunner().invoke(contention, args)
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["burst"], report["prefix_tokens"], report["question_tokens"]) == (2, 64, 8)
    assert [r["lock"] for r in report["results"]] == list(LOCKS)
    for row in report["results"]:
        assert row["runs"] == 1 and 0 < row["alone_ms"] and 0 < row["ttft_ms"] <= row["ttft_max_ms"]
        assert row["burst_ms"] > 0 and row["requests"] == 1
    refused = CliRunner().invoke(contention, ["--burst", "0"])
    assert refused.exit_code == 2 and "must be >= 1" in refused.output
    # Saturated: clients send requests back to back; the lock without the bound is added.
    done = CliRunner().invoke(contention, [*args, "--clients", "2", "--window", "3"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["clients"], report["window_s"]) == (2, 3.0)
    assert [r["lock"] for r in report["results"]] == list(SATURATED_LOCKS)
    assert all(r["requests"] > r["runs"] for r in report["results"])
