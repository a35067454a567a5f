"""Chunk spans from the canonical prompt to the worker's request body (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from rag.prompt import Layout, PromptBuilder
from ragwarm.client.rag import PreparedQuery, completion_body
from ragwarm.client.wire import RetrievedChunk
from schemas.prefix import prompt_chain
from workers.api import CompletionRequest, check_spans_of


class CharTokenizer:
    """One token per character: spans are easy to check by hand."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    content_hash: str
    text: str


CHUNKS = [Chunk("b.md#0", "b" * 64, "beta"), Chunk("a.md#1", "a" * 64, "alpha text")]


def test_each_span_holds_exactly_its_chunk_block_tokens() -> None:
    builder = PromptBuilder(CharTokenizer(), "sys", Layout.plain())
    prompt = builder.build(CHUNKS, "why?")
    assert len(prompt.chunk_spans) == len(prompt.chunk_refs) == 2
    by_id = {c.chunk_id: c for c in CHUNKS}
    for ref, (start, end) in zip(prompt.chunk_refs, prompt.chunk_spans, strict=True):
        assert list(prompt.token_ids[start:end]) == builder.chunk_ids(by_id[ref.chunk_id])
    assert prompt.chunk_spans[0][0] == len(builder.opening_ids())
    assert prompt.chunk_spans[-1][1] < prompt.prefix_len  # the separator follows


def test_the_request_body_carries_spans_the_worker_accepts() -> None:
    builder = PromptBuilder(CharTokenizer(), "sys", Layout.plain())
    prompt = builder.build(CHUNKS, "why?")
    chain = prompt_chain(prompt.token_ids, prompt.prefix_len, tenant="t", model="m",
                         block_size=4)
    chunks = tuple(RetrievedChunk(c.chunk_id, c.content_hash, c.chunk_id.split("#")[0], c.text)
                   for c in CHUNKS)
    prepared = PreparedQuery("why?", "t", chunks, prompt, chain, 0.0)
    body = completion_body(prepared, 4, 0.0, chunk_reuse=False)
    assert body["chunk_reuse"] is False
    request = CompletionRequest.model_validate(body)
    spans = check_spans_of(request, request.single_prompt(), len(prompt.token_ids))
    assert [(s.ref[0], s.start, s.end) for s in spans] == [
        (r.chunk_id, a, b) for r, (a, b) in zip(prompt.chunk_refs, prompt.chunk_spans,
                                                 strict=True)
    ]
