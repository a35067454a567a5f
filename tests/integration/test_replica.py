"""Issue 14, the replicated index: chunks are embedded once, by the instance owning the
document, and every other instance keeps its local Qdrant replica from `rag.chunks`.
Real broker, real embedder, Qdrant local mode, two `ragwarm streams` processes."""

from __future__ import annotations

import httpx
import pytest

from ragwarm.models import llm_dir
from schemas import KbChange
from schemas.topics import KB_CHANGES
from tests.integration.e2e_kit import QUESTION, initial_docs
from tests.integration.kb_stack import send_docs
from tests.integration.streams_proc import StreamsApp, wait_ready
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

QUESTIONS = [
    QUESTION,
    "How do I get help or support for Argo CD?",
    "Why is my application stuck in the progressing state?",
]
EDITED = "docs/faq.md"


def retrieve(app: StreamsApp, question: str, k: int) -> list[dict]:
    response = httpx.post(f"{app.url}/ragwarm/retrieve", timeout=120,
                          json={"question": question, "tenant": "default", "k": k})
    response.raise_for_status()
    return response.json()["chunks"]


def top(app: StreamsApp, question: str, k: int = 3) -> list[tuple[str, str]]:
    return [(r["chunk_id"], r["content_hash"]) for r in retrieve(app, question, k)]


def whole_kb(app: StreamsApp) -> dict[str, tuple[str, int]]:
    """chunk id -> (content hash, version) of every chunk (the KB is under the 50 of k)."""
    rows = retrieve(app, "Argo CD", 50)
    assert len(rows) < 50, "the test KB must fit one retrieval"
    return {r["chunk_id"]: (r["content_hash"], r["version"]) for r in rows}


@pytest.mark.timeout(1500)
def test_an_instance_with_an_empty_home_retrieves_the_whole_kb_without_embedding(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, tmp_path
):
    docs = initial_docs()
    send_docs(kafka_producer, namespace + KB_CHANGES, list(docs.values()))
    first = streams_factory(namespace, "replica").start()
    wait_for(lambda: first.counters().get("kb_events", 0) >= len(docs), 300, "indexing")
    assert first.counters()["chunks_embedded"] > 0
    kb = whole_kb(first)
    assert {cid.rpartition("#")[0] for cid in kb} == set(docs)

    # Same app id (same consumer group, tables), another port, nothing on disk (its own
    # workdir, so its log and pid file are its own); only the model copy is shared.
    home = tmp_path / "empty-home"
    home.mkdir()
    second = StreamsApp(kafka_bootstrap, namespace, "replica", home, {
        "RAGWARM_HOME": str(home),
        "RAGWARM_MODEL_LLM_PATH": str(llm_dir()),
        "RAGWARM_QDRANT_PATH": str(home / "qdrant"),
        "RAGWARM_STREAMS_DATA_DIR": str(home / "faust"),
    }).start()
    print(f"\nsecond instance ready {wait_ready(second):.1f} s after its web views")
    assert whole_kb(second) == kb
    for question in QUESTIONS:
        assert top(second, question) == top(first, question)
    counters = second.counters()
    print(f"{len(kb)} chunks; second instance: {counters}")
    assert counters.get("chunks_embedded", 0) == 0
    assert counters.get("index_recovered", 0) == 0
    assert counters["replica_written"] >= len(kb)

    # An edit that drops the document's second half: whichever instance owns it indexes
    # it; both replicas lose the old chunks and hold only the new version's.
    old = {cid for cid in kb if cid.startswith(EDITED + "#")}
    text = docs[EDITED].text
    cut = text[: text.index("\n## ", len(text) // 2)]
    edit = KbChange(op="upsert", doc_id=EDITED, version=docs[EDITED].version + 1000, text=cut)
    send_docs(kafka_producer, namespace + KB_CHANGES, [edit])

    def converged() -> bool:
        got = [whole_kb(first), whole_kb(second)]
        faq = [{c: v for c, v in g.items() if c.startswith(EDITED + "#")} for g in got]
        return got[0] == got[1] and all(
            faq[0] and len(f) < len(old) and {v for _, v in f.values()} == {edit.version}
            for f in faq
        )

    wait_for(converged, 180, "both replicas at the edited version")
    after = whole_kb(second)
    gone = old - set(after)
    assert gone, "the shortened document dropped none of its chunks"
    assert {c: v for c, v in after.items() if not c.startswith(EDITED + "#")} == {
        c: v for c, v in kb.items() if not c.startswith(EDITED + "#")
    }
