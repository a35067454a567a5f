"""`ragwarm demo` end to end on a small slice of the Argo CD trace, then nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragwarm.kafka.admin import list_topics
from ragwarm.models import llm_dir
from ragwarm.ports import free_port
from ragwarm.settings import TRACE_DIR

pytestmark = pytest.mark.integration

DOCS = {"docs/faq.md", "docs/user-guide/sync-waves.md", "docs/developer-guide/ci.md",
        "docs/index.md"}
RAGWARM = Path(sys.executable).with_name("ragwarm")


def small_trace(tmp_path: Path) -> tuple[Path, Path]:
    """The initial state of four documents and their edits, with their questions."""
    events, questions = tmp_path / "events.jsonl", tmp_path / "questions.jsonl"
    with (TRACE_DIR / "events.jsonl").open() as src, events.open("w") as out:
        out.writelines(line for line in src if json.loads(line)["doc_id"] in DOCS)
    with (TRACE_DIR / "questions.jsonl").open() as src, questions.open("w") as out:
        out.writelines(line for line in src if json.loads(line)["doc_id"] in DOCS)
    return events, questions


def test_demo_rewarms_edited_questions_and_tears_everything_down(
    kafka_bootstrap, kafka_settings, tmp_path
):
    events, questions = small_trace(tmp_path)
    home = tmp_path / "home"
    env = {
        **os.environ,
        # Its own state dir, ports and the session's broker: nothing shared with other runs.
        "RAGWARM_HOME": str(home),
        "RAGWARM_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RAGWARM_MODEL_LLM_PATH": str(llm_dir()),
        "RAGWARM_STREAMS_WEB_PORT": str(free_port()),
        "RAGWARM_STACK_WORKER_PORT": str(free_port()),
        "RAGWARM_WORKER_THREADS": "2",
    }
    done = subprocess.run(
        [str(RAGWARM), "demo", "--events", str(events), "--questions", str(questions),
         "--edits", "2", "--hot-questions", "2", "--samples", "1", "--max-tokens", "2",
         "--json",
         "--out", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=540, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    rows = result["queries"]
    asked = {r["question"] for r in rows}
    assert 1 <= len(asked) <= 2
    for q in asked:
        mine = [r for r in rows if r["question"] == q]
        phases = [r["phase"] for r in mine]
        # Phases say what the cache held, not the order of asking: the first ask may share the
        # system prompt's blocks with another question (partial), the second may already be
        # warm (its query was tracked and its prefix warmed).
        assert len(phases) == 4 and phases[0] in ("cold", "partial") and phases[3] == "after_edit"
        assert phases[1] in ("cold", "partial", "warm") and phases[2] == "warm"
        cold, _, warm, after = mine
        # Plain prefix caching was measured beside every ask, on its own worker.
        assert all(r["reactive_ttft_ms"] > 0 and r["reactive_cached"] >= 0 for r in mine)
        # Warm: the hot-token pin or the worker's own request cache (the product default).
        assert warm["cached_tokens"] >= warm["prefix_tokens"] // 16 * 16 > cold["cached_tokens"]
        # Re-warmed after the edit: the new prompt was never asked, so the whole prefix already
        # in the worker's cache is the pipeline's re-prefill.
        assert after["cached_tokens"] >= after["prefix_tokens"] // 16 * 16 > 0
    assert result["prefills"] >= 1
    assert result["invalidations"] + result["ttl_extensions"] >= 1
    assert Path(result["chart"]).read_bytes()[:4] == b"\x89PNG"

    # Torn down: no process of this run, no topics of its namespace, no state of it left.
    assert not processes_with_env(f"RAGWARM_HOME={home}")
    prefix = result["topic_prefix"]
    assert prefix.startswith("demo.")
    assert not [t for t in list_topics(kafka_bootstrap, kafka_settings.client_options())
                if t.startswith(prefix)]
    assert not list((home / "demo").glob("*")) if (home / "demo").exists() else True


def processes_with_env(entry: str) -> list[int]:
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue  # gone, or not ours
    return found
