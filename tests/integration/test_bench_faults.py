"""`ragwarm bench faults` on a tiny trace of its own (the shared format, not Argo CD): one
streams kill that is also the host move, a worker kill, a broker stop/start and a store
outage, all on the benchmark's own broker; the JSON keeps the issue's contract and the
end state equals the trace's oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

SECTIONS = {
    "deploy.md": "# Deploying\n\nSync waves order the resources of an application. A wave "
                 "starts once every resource of the previous wave is healthy.\n",
    "rbac.md": "# Access\n\nRoles grant projects to groups. The admin role may sync every "
               "application of every project.\n",
    "hooks.md": "# Hooks\n\nA PreSync hook runs before the sync starts; a PostSync hook "
                "runs once every resource is healthy.\n",
}


def write_trace(folder: Path) -> tuple[Path, Path]:
    rows = [{"seq": i, "timestamp": f"2024-01-01T00:00:{i:02d}Z", "op": "upsert",
             "doc_id": doc, "text": text, "initial": True}
            for i, (doc, text) in enumerate(SECTIONS.items())]
    edits = [("deploy.md", " Waves may also carry a delay."),
             ("rbac.md", " Read-only users see the UI only."),
             ("deploy.md", " A failed wave stops the sync.")]
    texts = dict(SECTIONS)
    for n, (doc, extra) in enumerate(edits, start=len(rows)):
        texts[doc] = texts[doc].rstrip("\n") + extra + "\n"
        rows.append({"seq": n, "timestamp": f"2024-01-02T00:00:{n:02d}Z", "op": "upsert",
                     "doc_id": doc, "text": texts[doc]})
    events = folder / "events.jsonl"
    events.write_text("".join(json.dumps(r) + "\n" for r in rows))
    questions = folder / "questions.jsonl"
    questions.write_text(
        json.dumps({"qid": "q1", "question": "In which order do sync waves run?",
                    "doc_id": "deploy.md"}) + "\n"
        + json.dumps({"qid": "q2", "question": "Who may sync every application?",
                      "doc_id": "rbac.md"}) + "\n")
    return events, questions


def test_a_small_fault_run_loses_nothing(tmp_path):
    events, questions = write_trace(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "ragwarm.cli", "bench", "faults", "--events", str(events),
         "--questions", str(questions), "--kills", "1", "--seed", "3", "--docs", "0",
         "--hot", "1", "--queries", "4", "--edit-gap-s", "1", "--grace-s", "5", "--json"],
        capture_output=True, text=True, timeout=1400,
    )
    print(done.stderr[-4000:], done.stdout)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert list(result) == [
        "faults", "worker_disk_tier", "streams_instances", "kb_versions_expected",
        "kb_versions_indexed", "lost_invalidations", "stale_served", "queries", "query_errors",
        "transient_dead_letters", "worker_rewarm_s", "worker_restart_phases_s",
        "streams_recovery_s_p50", "streams_recovery_s_max", "streams_recovery_phases_s_p50",
        "streams_recovery_log_s_p50",
        "ttft_p50_ms", "answered_during_outage", "errors_during_outage", "outage_ttft_p50_ms",
        "outages",
    ]
    assert result["faults"] == {"streams_kills": 1, "worker_kills": 1, "broker_restarts": 1,
                                "store_outages": 1, "host_moves": 1}
    assert result["kb_versions_expected"] == result["kb_versions_indexed"] == 3
    assert result["lost_invalidations"] == result["stale_served"] == 0
    assert result["transient_dead_letters"] == 0
    assert result["worker_rewarm_s"] is not None and result["worker_rewarm_s"] > 0
    assert result["queries"] >= 1 and result["streams_recovery_s_max"] > 0
    # The ready probe's reasons name every part still pending ("recovering tables; loading
    # the tokenizer" while the models load beside Faust): table recovery is one of them.
    assert any("recovering tables" in phase for phase in result["streams_recovery_phases_s_p50"])
    # One per fault injected (the host move is the streams kill), with what it answered.
    assert sorted(o["kind"] for o in result["outages"]) == [
        "broker_restarts", "host_moves", "store_outages", "worker_kills"]
    assert result["answered_during_outage"] == sum(o["answered"] for o in result["outages"])
