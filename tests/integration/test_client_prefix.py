"""The client's prompt prefix is the one the streams app warms (real store, embedder, tokenizer)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from rag.index import Indexer
from rag.prompt import PromptBuilder
from rag.retrieve import Retriever
from rag.settings import QdrantSettings, RagSettings
from rag.store import ChunkStore
from ragwarm.client.core import ClientConfig
from ragwarm.client.rag import QdrantRetrieval, RagClient
from ragwarm.client.settings import ClientSettings
from ragwarm.models import llm_dir, load_embedder, load_tokenizer
from ragwarm.rag_port import RagService
from ragwarm.settings import TRACE_DIR
from schemas import KbChange

pytestmark = pytest.mark.integration

EVENTS = TRACE_DIR / "events.jsonl"
DOCS = ("docs/faq.md", "docs/user-guide/sync-waves.md")
QUESTIONS = ("I forgot the admin password, how do I reset it?", "How Do I Configure Waves?")


def initial(doc_ids: tuple[str, ...]) -> list[KbChange]:
    with EVENTS.open() as f:
        rows = [json.loads(line) for line in f]
    return [KbChange(op="upsert", doc_id=r["doc_id"], version=r["seq"], text=r["text"])
            for r in rows if r["initial"] and r["doc_id"] in doc_ids]


def test_direct_qdrant_retrieval_gives_the_prefix_the_streams_app_warms(tmp_path):
    torch.set_num_threads(2)
    rag = RagSettings()
    tokenizer = load_tokenizer(llm_dir())
    embedder = load_embedder()
    prompts = PromptBuilder(tokenizer, rag.system_prompt)
    with ChunkStore.open(QdrantSettings(path=tmp_path / "q"), "client", embedder.dim) as store:
        indexer = Indexer.from_settings(store, embedder, tokenizer, rag)
        indexer.index_documents(initial(DOCS))
        retriever = Retriever(store, embedder, rag.top_k)
        service = RagService(store, indexer, retriever, prompts, "smollm2-135m-instruct")
        streams = httpx.Client(base_url="http://127.0.0.1:9")  # never called by prepare()
        config = ClientConfig(ClientSettings(), "smollm2-135m-instruct", top_k=rag.top_k)
        client = RagClient(config, prompts, streams, QdrantRetrieval(retriever))
        for question in QUESTIONS:
            prepared = client.prepare(question)
            warm = service.prefix_for_question(question, "default")
            assert warm is not None and prepared.prefix_hash == warm.prefix_hash
            assert list(prepared.prompt.prefix_ids) == list(warm.token_ids)
            assert sorted(prepared.prompt.chunk_refs, key=lambda r: r.chunk_id) == sorted(
                warm.chunk_refs, key=lambda r: r.chunk_id)
            # Search results through the streams view's shape map to the same chunks.
            viewed = service.search(question, "default", rag.top_k)
            assert [c["chunk_id"] for c in viewed] == [c.chunk_id for c in prepared.chunks]
        streams.close()
