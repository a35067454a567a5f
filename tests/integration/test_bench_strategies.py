"""`ragwarm bench strategies` on a tiny trace: real model, real Qdrant, real timings."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ragwarm.bench.strategies.command import strategies
from ragwarm.bench.strategies.metrics import JSON_KEYS, POLICY_JSON_KEYS, percentile
from ragwarm.bench.strategies.policies import policy_class, policy_names
from workers.engines.torch_engine import TorchEngine
from workers.settings import HOST_TIER_PER_KV_BYTE

pytestmark = pytest.mark.integration

QUERIES = 10
RUNS = 3  # runs per query; the reported TTFT is their lower median


def _doc(topic: str) -> str:
    body = " ".join(f"The {topic} option {i} changes how {topic} works." for i in range(8))
    return f"# {topic.title()}\n\n## Overview\n\n{body}\n\n## Details\n\n{body}"


def write_trace(folder: Path) -> tuple[Path, Path]:
    """Four documents, three commits editing two of them, one re-ingest, four questions."""
    docs = {f"{t}.md": _doc(t) for t in ("certificate", "rbac", "sync", "hook")}
    events = [{"seq": i, "timestamp": "2024-01-01T00:00:00Z", "op": "upsert", "doc_id": d,
               "text": t, "initial": True} for i, (d, t) in enumerate(docs.items())]
    for rev in range(3):
        for name in ("certificate.md", "sync.md"):
            docs[name] = docs[name].replace("Overview", f"Overview (rev {rev})", 1)
            events.append({"seq": len(events), "timestamp": f"2024-02-0{rev + 1}T00:00:00Z",
                           "op": "upsert", "doc_id": name, "text": docs[name]})
    events.append({"seq": len(events), "timestamp": "2024-03-01T00:00:00Z", "op": "upsert",
                   "doc_id": "rbac.md", "text": docs["rbac.md"]})
    questions = [
        {"qid": "a", "question": "How do I configure certificates?", "doc_id": "certificate.md"},
        {"qid": "b", "question": "What does rbac control?", "doc_id": "rbac.md"},
        {"qid": "c", "question": "How are sync options ordered?", "doc_id": "sync.md"},
        {"qid": "d", "question": "When do hooks run?", "answer_doc_ids": ["hook.md"]},
    ]
    paths = folder / "events.jsonl", folder / "questions.jsonl"
    for path, rows in zip(paths, (events, questions), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run of every policy; the engine's measured TTFTs are recorded beside it."""
    folder = tmp_path_factory.mktemp("strategies")
    events, questions = write_trace(folder)
    measured: list[float] = []
    original = TorchEngine.generate

    def recording(self, request):  # the real generation, observed
        # Served requests are greedy; synthetic warmup's sampling is no served request.
        served = not request.temperature
        for step in original(self, request):
            if step.result is not None and served:
                measured.append(step.result.ttft_s * 1000)
            yield step

    env = {"RAGWARM_STRATEGIES_TTFT_RUNS": str(RUNS), "RAGWARM_STRATEGIES_CHUNK_TOKENS": "48",
           "RAGWARM_STRATEGIES_MEAN_GAP_S": "20", "RAGWARM_STRATEGIES_BURST_PROB": "0.3"}
    out = folder / "out"
    args = ["--events", str(events), "--questions", str(questions), "--queries", str(QUERIES),
            "--edits", "7", "--seed", "3", "--restart-at", "0.6", "--json", "--out", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TorchEngine, "generate", recording)
        result = CliRunner().invoke(strategies, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "queries.jsonl").read_text().splitlines()]
    return {"report": json.loads(result.stdout), "rows": rows, "measured": measured, "out": out}


def test_json_is_the_contract(run):
    report = run["report"]
    assert set(report) == {"policies", "queries", "kb_events", "measurements", "seed_table",
                           "restart", "kv_budget"}
    meta = json.loads((run["out"] / "run.json").read_text())["meta"]
    assert report["kv_budget"] == {k: meta[k] for k in ("memory_share", "budget_bytes",
                                                        "distinct_prefix_bytes",
                                                        "host_tier_bytes")}
    # The host tier of hybrid and reactive-offload: the worker's default, sized on the budget.
    assert meta["host_tier_bytes"] == HOST_TIER_PER_KV_BYTE * meta["budget_bytes"]
    assert list(report["policies"]) == policy_names()
    assert report["queries"] == QUERIES and report["kb_events"] == 7
    for name, figures in report["policies"].items():
        own = set(POLICY_JSON_KEYS) if name == "synthetic" else set()
        assert set(figures) == set(JSON_KEYS) | own
        assert isinstance(figures["stale_hits"], int)


def test_every_reported_ttft_was_measured_by_the_engine(run):
    measured = run["measured"]
    meta = json.loads((run["out"] / "run.json").read_text())["meta"]
    # Policies whose request was the same computation share one measurement of RUNS runs;
    # the others still run their request once, as deployed, for its effect on their cache.
    assert run["report"]["measurements"] == meta["measurements"]
    assert QUERIES <= meta["measurements"] < QUERIES * len(policy_names())
    assert meta["requests"] == QUERIES * len(policy_names())
    # A request read back from the disk tier runs once, timed, and shares with no one.
    assert len(measured) == (meta["measurements"] * RUNS + meta["untimed_runs"]
                             + meta["restore_runs"])
    # A row's TTFT is a measurement plus its wait behind the worker's warmups (simulated).
    for r in run["rows"]:
        assert min(abs(r["ttft_ms"] - r["queued_ms"] - m) for m in measured) < 1e-6
    for name in policy_names():
        mine = [r["ttft_ms"] for r in run["rows"] if r["policy"] == name]
        assert len(mine) == QUERIES
        assert all(t > 0 for t in mine) and len(set(mine)) > 1
        figures = run["report"]["policies"][name]
        assert figures["ttft_p50_ms"] == round(percentile(mine, 50), 2)
        assert figures["ttft_p90_ms"] == round(percentile(mine, 90), 2)
        assert figures["ttft_p99_ms"] == round(percentile(mine, 99), 2)
    # Same prompt, same cached tokens in one query: one measured TTFT for all who shared it
    # (a blending worker and a read back from a tier never share); the wait behind warmups
    # is each lane's own.
    by_query: dict[tuple[int, int], set[float]] = {}
    for r in run["rows"]:
        if r["restored"] or policy_class(r["policy"]).chunk_reuse:
            continue
        measured_ms = round(r["ttft_ms"] - r["queued_ms"], 6)
        by_query.setdefault((r["index"], r["cached_tokens"]), set()).add(measured_ms)
    assert all(len(ttfts) == 1 for ttfts in by_query.values())


def test_figures_follow_the_rows(run):
    for name, figures in run["report"]["policies"].items():
        mine = [r for r in run["rows"] if r["policy"] == name]
        assert figures["hit_rate"] == round(sum(r["hit"] for r in mine) / len(mine), 4)
        assert figures["stale_hits"] == 0
        assert 0.0 <= figures["kv_memory_share"] <= 1.0
    baseline = [r for r in run["rows"] if r["policy"] == "none"]
    assert all(r["cached_tokens"] == 0 for r in baseline)
    assert run["report"]["policies"]["none"]["warmup_seconds"] == 0.0
    assert run["report"]["policies"]["event-rag"]["warmup_seconds"] > 0.0
    synthetic = run["report"]["policies"]["synthetic"]
    assert 0.0 <= synthetic["synthetic_memory_share"] <= synthetic["synthetic_memory_share_max"]
    assert synthetic["synthetic_memory_share_max"] <= 0.05


def test_outputs_are_written(run):
    out: Path = run["out"]
    for name in ("strategies.md", "strategies.csv", "ttft_cdf.png", "hit_rate_over_time.png",
                 "run.json"):
        assert (out / name).stat().st_size > 0
    with (out / "strategies.csv").open() as handle:
        assert [r["policy"] for r in csv.DictReader(handle)] == policy_names()
    assert "| event-rag |" in (out / "strategies.md").read_text()


def test_seed_table_sits_beside_ours(run):
    table = {r["policy"]: r for r in run["report"]["seed_table"]}
    assert table["tiered"]["seed_p99_change"] == -0.68 and table["tiered"]["ran"]
    # Disk is shown apart from device memory; `hybrid`'s host tier is not disk.
    assert table["tiered"]["disk_share"] is not None and table["hybrid"]["disk_share"] is None
    assert "| tiered KV cache | tiered |" in (run["out"] / "strategies.md").read_text()


def test_a_restart_empties_every_device_cache_and_tiered_boots_from_its_disk(run):
    restart = run["report"]["restart"]
    figures = restart["policies"]
    assert list(figures) == policy_names()
    # `tiered` keeps a disk tier; `hybrid` and its peer `reactive-offload` the worker's
    # default host tier, which a restart loses like the device cache; the rest keep none.
    disk = {n for n in policy_names() if policy_class(n).disk_tier}
    host = {n for n in policy_names() if policy_class(n).host_tier} - disk
    assert disk == {"tiered"} and {"hybrid", "reactive-offload"} <= host
    assert figures["tiered"]["tier_blocks"] > 0  # its warm prefixes were written through
    assert all(figures[name]["tier_blocks"] == 0 for name in host)
    tiers = disk | host
    assert all(f["tier_blocks"] is None for name, f in figures.items() if name not in tiers)
    assert all(f["stale_hits_after"] == 0 for f in figures.values())
    after = [r for r in run["rows"] if r["since_restart"] is not None]
    assert len(after) == len(policy_names()) * (QUERIES - round(0.6 * QUERIES))
    # Every worker came back empty: whatever it reused after the restart, it warmed, stored
    # or (with a tier) read back from what it spilled or kept on disk.
    assert all(not r["restored"] for r in run["rows"] if r["policy"] not in tiers)
    # Request caching alone warms nothing at boot: its first answer after the restart is cold.
    first = {r["policy"]: r for r in after if r["since_restart"] == 0}
    assert first["reactive"]["cached_tokens"] == 0 and first["none"]["cached_tokens"] == 0


def test_model_free_takes_the_same_decisions_and_says_its_ttft_is_estimated(run, tmp_path):
    """The same command with `--model-free`: every policy that needs no tensors nor text
    from the model, on the cost engine; each query's hit and cached tokens are the real
    run's, and each TTFT is the cost model's estimate (labelled so), not a measurement."""
    from ragwarm.bench.strategies.policies import model_free
    from ragwarm.settings import ModelSettings
    from workers.cost_engine import DEFAULT_COST, CostModel, calibrated_share

    folder = run["out"].parent
    out = tmp_path / "model-free"
    env = {"RAGWARM_STRATEGIES_TTFT_RUNS": str(RUNS), "RAGWARM_STRATEGIES_CHUNK_TOKENS": "48",
           "RAGWARM_STRATEGIES_MEAN_GAP_S": "20", "RAGWARM_STRATEGIES_BURST_PROB": "0.3"}
    args = ["--events", str(folder / "events.jsonl"), "--questions",
            str(folder / "questions.jsonl"), "--queries", str(QUERIES), "--edits", "7",
            "--seed", "3", "--restart-at", "0.6", "--json", "--model-free", "--out", str(out)]
    result = CliRunner().invoke(strategies, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    names = [n for n in policy_names() if model_free(policy_class(n))]
    assert list(report["policies"]) == names and "tiered" not in names
    cost = CostModel(*DEFAULT_COST).for_share(calibrated_share(ModelSettings().llm_name))
    assert report["ttft_estimated"] == {"fixed_ms": cost.fixed_ms,
                                        "per_token_ms": cost.per_token_ms,
                                        "recompute_share": cost.recompute_share,
                                        "moved_token_cost": round(cost.moved_share, 4)}
    rows = [json.loads(line) for line in (out / "queries.jsonl").read_text().splitlines()]
    # A blending worker decides by its cost estimate (the engine's timings here, the cost
    # model there) and never stores a blended prompt, so its cache may differ: the exact
    # policies' decisions must match.
    exact = {n for n in names if not policy_class(n).chunk_reuse}
    decided = {(r["policy"], r["index"]): (r["hit"], r["cached_tokens"]) for r in rows
               if r["policy"] in exact}
    real = {(r["policy"], r["index"]): (r["hit"], r["cached_tokens"]) for r in run["rows"]
            if r["policy"] in exact}
    assert decided == real
    for r in rows:
        prompt, cached, moved = r["prompt_tokens"], r["cached_tokens"], r["blended_tokens"]
        expected = cost.blend_ttft_ms(prompt, cached, moved) if moved else \
            cost.ttft_ms(prompt, cached)
        if r["restored"]:  # plus the read back from the host tier, at most every cached token
            restore_ms = r["ttft_ms"] - r["queued_ms"] - expected
            assert 0 < restore_ms <= cost.restore_per_token_ms * cached + 1e-6
        else:
            assert r["ttft_ms"] == pytest.approx(expected + r["queued_ms"])
    text = (out / "strategies.md").read_text()
    assert "est. TTFT p50 ms" in text and "Model-free" in text
    # The budget every policy ran under is part of the report; --memory-share moves it.
    budget = report["kv_budget"]
    assert budget["memory_share"] == 0.4
    assert budget["budget_bytes"] == int(0.4 * budget["distinct_prefix_bytes"]) > 0
    larger = CliRunner().invoke(strategies, [*args[:-2], "--policies", "none,reactive",
                                             "--memory-share", "0.8", "--out",
                                             str(tmp_path / "larger")], env=env)
    assert larger.exit_code == 0, larger.output
    moved = json.loads(larger.stdout)["kv_budget"]
    assert moved["memory_share"] == 0.8
    assert moved["distinct_prefix_bytes"] == budget["distinct_prefix_bytes"]
    assert moved["budget_bytes"] == int(0.8 * budget["distinct_prefix_bytes"])
    # A policy that needs the model is refused by name, not silently run without it.
    refused = CliRunner().invoke(strategies, [*args[:-2], "--policies", "tiered", "--out",
                                              str(tmp_path / "refused")])
    assert refused.exit_code != 0 and "tiered" in refused.output
