"""Several questions' prefixes per store call (`streams.handle.retrieval`): the hot tick, an edit's
re-warms and the edit watch embed their questions in batches, not one by one."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import ChunkRef
from streams.handle import handlers, retrieval
from streams.handle.ports import WarmPrefix
from streams.sim import run_sync
from tests.unit.conftest import Port, pipeline, query

STALE = [ChunkRef(chunk_id="d.md#0", content_hash="0" * 64)]  # no longer current


class BatchPort(Port):
    """Retrieves a prefix named after each question, recording each call's questions."""

    def __init__(self) -> None:
        super().__init__({("default", "d.md#0"): "1" * 64})
        self.batches: list[list[str]] = []

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        raise AssertionError("retrieved one by one")

    def prefixes_for_questions(self, questions: Sequence[str], tenant: str):
        self.batches.append(list(questions))
        return [None if q.startswith("nothing") else
                WarmPrefix(prefix_hash=f"{q:>64}", token_ids=[7] * 32, chunk_refs=[])
                for q in questions]


def test_batches_cover_the_items_in_order():
    assert retrieval.batches(list(range(19)), 8) == [
        list(range(8)), list(range(8, 16)), list(range(16, 19))]
    assert retrieval.batches([], 8) == []


def test_a_port_without_batches_is_asked_one_question_at_a_time():
    port = Port({})
    assert retrieval.prefixes_for_questions(port, ["a", "b"], "default") == [None, None]


def test_the_hot_tick_retrieves_its_new_hot_prefixes_in_batches():
    port = BatchPort()
    p, out = pipeline(port, hot_min_count=1.0, track_queries=False, kv_bytes_per_token=1,
                      hot_share=0.5)
    asked = [f"q{n:02}" for n in range(10)] + ["nothing here"]
    for question in asked:
        for _ in range(2):  # hot: asked twice; their chunks changed since
            run_sync(handlers.on_query(p, query(question).model_copy(update={
                "prefix_hash": f"{question:>64}".replace(" ", "h"), "chunk_refs": STALE})))
    run_sync(handlers.plan_hot(p))
    assert sorted(q for b in port.batches for q in b) == sorted(asked)
    assert [len(b) for b in port.batches] == [8, 3]
    # One pinned warm op per retrieved prefix, none for the question that retrieved nothing.
    assert sorted(o.question for o in out.ops) == asked[:-1]
    assert all(o.pin for o in out.ops)


def test_an_edits_rechecks_are_retrieved_in_batches_and_warm_what_its_chunks_entered():
    from tests.unit.conftest import ask, edited

    port = BatchPort()
    entered = WarmPrefix(prefix_hash="f" * 64, token_ids=[8] * 32,
                         chunk_refs=[ChunkRef(chunk_id="d.md#0", content_hash="2" * 64)])
    port.prefixes_for_questions = lambda qs, tenant: (  # type: ignore[method-assign]
        port.batches.append(list(qs)) or [entered if q == "q03" else None for q in qs])
    p, out = pipeline(port, kv_bytes_per_token=1, edit_rewarm_share=0.5, hot_tokens=False,
                      track_queries=False)
    other = [ChunkRef(chunk_id="x.md#0", content_hash="7" * 64)]
    for n in range(10):  # none uses a chunk of d.md
        ask(p, f"{n}" * 64, f"q{n:02}", 10.0 + n, other)
    edited(p, [], 40.0)
    assert [len(b) for b in port.batches] == [8, 2]
    assert p.stats["edit_rechecks"] == 10 and p.stats["edit_recheck_warms"] == 1
    [op] = out.ops
    assert (op.prefix_hash, op.question, op.hold) == ("f" * 64, "q03", True)
