"""Synthetic warmup's pure parts: which documents, the command, the memory share, the
worker's rate limit and question cleaning, and the v4 schemas that carry them."""

from __future__ import annotations

import pytest

from schemas import ChunkRef, WarmupCommand, WorkerEvent, decode, encode
from schemas.events import WarmupCommandV3, WorkerEventV3, WorkerEventV4
from streams.decide import synthetic as syn
from streams.decide.records import DocState
from streams.decide.synthetic import SynthesisPrompt
from workers.synthesis import (
    RateLimit,
    clean_question,
    clean_questions,
    sampling_bytes,
    within_share,
)

H1, H2 = "1" * 64, "2" * 64


def ref(chunk_id: str, h: str = H1) -> ChunkRef:
    return ChunkRef(chunk_id=chunk_id, content_hash=h)


# --- which documents ---------------------------------------------------------------------


def test_a_new_or_edited_document_is_asked_about_a_delete_or_resend_is_not():
    new = DocState(version=2, chunks={"a#0": H1})
    assert syn.changed_doc(None, new)
    assert syn.changed_doc(DocState(version=1, chunks={"a#0": H2}), new)
    assert not syn.changed_doc(DocState(version=1, chunks={"a#0": H1}), new)
    assert not syn.changed_doc(None, DocState(version=3, deleted=True))


def test_doc_refs_follow_the_ordinals():
    state = DocState(version=1, chunks={"a#10": H1, "a#2": H2, "a#0": H1})
    assert [r.chunk_id for r in syn.doc_refs(state)] == ["a#0", "a#2", "a#10"]


def test_hot_docs_sum_the_counts_of_the_prefixes_holding_their_chunks():
    ranked = [("p1", 5.0, [ref("a#0"), ref("b#0")]), ("p2", 3.0, [ref("b#1"), ref("c#0")])]
    docs = syn.hot_docs(ranked, {"p1": "t", "p2": "t"})
    assert [(d.doc_id, d.heat) for d in docs] == [("b", 8.0), ("a", 5.0), ("c", 3.0)]
    assert [r.chunk_id for r in docs[0].refs] == ["b#0", "b#1"]
    assert all(d.tenant == "t" for d in docs)


def test_due_skips_documents_within_the_cooldown_and_stops_at_the_limit():
    docs = [syn.DocCandidate("t", d, ()) for d in "abc"]
    last = {syn.doc_key_of(docs[0]): 100.0}
    assert [d.doc_id for d in syn.due(docs, last, 150.0, 60.0, 5)] == ["b", "c"]
    assert [d.doc_id for d in syn.due(docs, last, 160.0, 60.0, 2)] == ["a", "b"]
    assert syn.due(docs, {}, 0.0, 60.0, 0) == []


def test_the_seed_is_reproducible_per_document_content_and_absent_without_a_base():
    a = syn.DocCandidate("t", "a", (ref("a#0"),))
    edited = syn.DocCandidate("t", "a", (ref("a#0", H2),))
    assert syn.sampling_seed(7, a) == syn.sampling_seed(7, a)
    assert syn.sampling_seed(7, a) != syn.sampling_seed(7, edited)
    assert syn.sampling_seed(7, a) != syn.sampling_seed(8, a)
    assert syn.sampling_seed(None, a) is None


def test_the_command_carries_the_prompt_and_the_sampling():
    prompt = SynthesisPrompt([1, 2, 3, 4], [ref("a#0")], primer_tokens=2)
    spec = syn.SynthesisSpec(3, 24, 1.3, 11, 40)
    cmd = syn.synthesize_command("c1", "w1", "t", prompt, spec, "why")
    assert cmd.op == "synthesize" and cmd.worker_id == "w1" and cmd.tenant == "t"
    assert (cmd.samples, cmd.max_new_tokens, cmd.temperature, cmd.seed, cmd.top_k) == (
        3, 24, 1.3, 11, 40)
    assert cmd.primer_tokens == 2 and cmd.token_ids == [1, 2, 3, 4]
    assert decode(encode(cmd)) == cmd


# --- memory share ------------------------------------------------------------------------


def test_chosen_prefixes_keep_the_worker_within_its_synthetic_share():
    held = {"old": syn.Held(40, expires_at=100.0), "gone": syn.Held(500, expires_at=5.0)}
    candidates = [("p1", 30), ("p2", 50), ("p3", 20), ("p1", 30), ("known", 10)]
    chosen = syn.choose_prefixes(candidates, held, ["known"], now=10.0, cap_bytes=100)
    # 40 live + 30 + 20 = 90 <= 100; p2 (50) would pass the cap; expired bytes do not count.
    assert chosen == [("p1", 30), ("p3", 20)]
    assert syn.live_bytes(held, 10.0) == 40
    assert syn.choose_prefixes(candidates, {}, [], 0.0, cap_bytes=0) == []


def test_prune_forgets_expired_prefixes():
    held = {"a": syn.Held(1, 5.0), "b": syn.Held(1, 50.0)}
    syn.prune(held, 10.0)
    assert list(held) == ["b"]


def test_first_asks_are_told_apart_from_repeats_and_bounded():
    asks = syn.FirstAsks(limit=2)
    assert asks.first("t", "How do I sync?")
    assert not asks.first("t", "how do  I SYNC?")
    assert asks.first("u", "How do I sync?")  # another tenant's question
    assert asks.first("t", "third")
    assert asks.first("t", "How do I sync?")  # the oldest was forgotten


# --- the worker's side -------------------------------------------------------------------


def test_the_rate_limit_allows_a_burst_then_refills_per_minute():
    rate = RateLimit(per_minute=6.0, burst=2)
    assert rate.allow(0.0) and rate.allow(0.0)
    assert not rate.allow(1.0)
    assert rate.allow(11.0)  # 10 s at 6 per minute is one more
    assert not rate.allow(11.5)
    assert not RateLimit(per_minute=0).allow(0.0)


def test_sampling_memory_is_bounded_by_the_share():
    need = sampling_bytes(prompt_tokens=200, max_new_tokens=24, kv_bytes_per_token=100)
    assert need == 22_400
    assert within_share(need, mem_total=448_000, share=0.05)
    assert not within_share(need, mem_total=447_999, share=0.05)
    assert not within_share(1, mem_total=0, share=0.05)


@pytest.mark.parametrize(("text", "question"), [
    ("How do I sync an app? It is easy.", "How do I sync an app?"),
    ("1. What is Argo CD?\nmore", "What is Argo CD?"),
    ('"How do I roll back"', "How do I roll back"),
    ("\n\n- Why does the   sync fail?", "Why does the sync fail?"),
    ("?!", None),
    ("ok", None),
])
def test_clean_question(text, question):
    assert clean_question(text) == question


def test_clean_questions_drop_duplicates_and_unusable_ones():
    assert clean_questions(["How do I A?", "how do i a?", "", "How do I B?"]) == [
        "How do I A?", "How do I B?"]


# --- schemas -----------------------------------------------------------------------------


def test_synthesize_needs_a_prompt_samples_and_a_temperature():
    base = {"command_id": "c", "op": "synthesize", "token_ids": [1, 2], "samples": 2,
            "max_new_tokens": 8, "temperature": 1.3}
    assert WarmupCommand(**base).schema_version == WarmupCommand.VERSION
    for field, bad in (("token_ids", []), ("samples", 0), ("temperature", None),
                       ("primer_tokens", 2)):
        with pytest.raises(ValueError, match=field if field != "samples" else "samples"):
            WarmupCommand(**(base | {field: bad}))
    with pytest.raises(ValueError):
        WarmupCommand(**(base | {"temperature": 3.0}))


def test_older_records_read_as_current_and_synthesized_round_trips():
    cmd = decode(encode(WarmupCommandV3(command_id="c", op="prefill", token_ids=[1])))
    assert type(cmd) is WarmupCommand and cmd.samples == 0 and cmd.top_k is None
    event = decode(encode(WorkerEventV3(worker_id="w", kind="ready", epoch=1)))
    assert type(event) is WorkerEvent and event.questions == []
    event = decode(encode(WorkerEventV4(worker_id="w", kind="ready", epoch=1, node="n1")))
    assert type(event) is WorkerEvent and event.node == "n1" and event.questions == []
    answer = WorkerEvent(worker_id="w", kind="synthesized", questions=["How do I X?"],
                         chunk_refs=[ref("a#0")], tenant="t")
    assert decode(encode(answer)) == answer
    with pytest.raises(ValueError):
        WorkerEventV4(worker_id="w", kind="synthesized")  # v4 has no such kind


def test_the_app_sends_no_sampling_the_worker_would_refuse():
    assert syn.sampling_fits(200, 24, 100, mem_total=448_000, share=0.05)
    assert not syn.sampling_fits(200, 24, 100, mem_total=447_999, share=0.05)
    assert not syn.sampling_fits(0, 0, 100, mem_total=1, share=0.05)
