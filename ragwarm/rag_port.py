"""The RAG layer as the streams app sees it: index, retrieve, and build warmable prefixes."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rag import replica
from rag.embed import TextEmbedder
from rag.index import Indexer, IndexResult
from rag.prompt import PromptBuilder, canonical_order
from rag.retrieve import Retriever
from rag.settings import QdrantSettings, RagSettings
from rag.store import ChunkStore
from ragwarm.settings import ModelSettings, qdrant_settings
from schemas import ChunkRef, KbChange
from schemas.chunks import Outgoing, ReplicaRecord
from schemas.events import ChunkSpan
from schemas.prefix import BLOCK_SIZE, PromptParams, prefix_chain
from streams.decide.synthetic import SynthesisPrompt
from streams.handle.ports import WarmPrefix

log = logging.getLogger(__name__)


def stale_refs(
    refs: Sequence[ChunkRef], held: Mapping[str, tuple[str, int]]
) -> list[tuple[str, str, str | None, int | None]]:
    """The refs not current in `held` (chunk id -> stored content hash and version), each as
    (chunk id, wanted hash, stored hash or None when absent, stored version or None)."""
    out = []
    for ref in refs:
        found = held.get(ref.chunk_id)
        if found is None or found[0] != ref.content_hash:
            out.append((ref.chunk_id, ref.content_hash, *(found or (None, None))))
    return out


class TimedEmbedder:
    """An embedder that adds the milliseconds it spends to `stats` (`embed_ms`). The texts
    it embeds are counted once, where they are published: `chunks_embedded`."""

    def __init__(self, inner: TextEmbedder, stats: Counter) -> None:
        self.inner, self.stats = inner, stats
        self.dim = inner.dim

    def embed(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        start = time.perf_counter()
        vectors = self.inner.embed(texts, progress)
        self.stats["embed_ms"] += round((time.perf_counter() - start) * 1000)
        return vectors


class RagService:
    """Implements `streams.handle.ports.RagPort` over a store, an embedder and the LLM tokenizer.

    Prefix hashes are computed exactly as workers compute them (same tokens, tenant and
    model salt), so the app can tell which prefix a worker will report without asking it.
    """

    def __init__(
        self,
        store: ChunkStore,
        indexer: Indexer,
        retriever: Retriever,
        prompts: PromptBuilder,
        model_salt: str,
        block_size: int = BLOCK_SIZE,
        replicated: bool = False,
    ):
        self.store = store
        self.indexer = indexer
        self.retriever = retriever
        self.prompts = prompts
        self.model_salt = model_salt
        self.block_size = block_size
        # Local mode: this store is one instance's replica, so what it indexes is published
        # on rag.chunks for the others. A Qdrant server is shared: nothing to publish.
        self.replicated = replicated
        self._outgoing: list[Outgoing] = []
        self._embedded = 0
        # Stale-ref reports already logged at info level (a repeat is logged at debug).
        self._stale_logged: set[tuple[str, tuple]] = set()

    @classmethod
    def open(
        cls,
        models: ModelSettings,
        rag: RagSettings | None = None,
        qdrant: QdrantSettings | None = None,
        on_part: Callable[[str], None] = lambda part: None,
    ) -> RagService:
        """Load the tokenizer and the embedder, then open the store; `on_part` is told each
        part before it loads (`ragwarm.rag_loading` reports it while the app starts)."""
        from ragwarm.models import llm_dir, load_embedder, load_tokenizer

        rag = rag or RagSettings()
        on_part("tokenizer")
        tokenizer = load_tokenizer(llm_dir(models=models))
        on_part("embedder")
        embedder = load_embedder(
            models, rag.embed_batch_size, rag.embed_precision, rag.embed_threads
        )
        qdrant = qdrant or qdrant_settings()
        on_part("index")
        store = ChunkStore.open(qdrant, rag.collection, embedder.dim)
        return cls(
            store,
            Indexer.from_settings(store, embedder, tokenizer, rag),
            Retriever(store, embedder, rag.top_k),
            PromptBuilder(tokenizer, rag.system_prompt),
            models.llm_name,
            replicated=qdrant.local,
        )

    @staticmethod
    def params_of(models: ModelSettings, rag: RagSettings) -> PromptParams:
        """`prompt_params` of the service `open` builds from these settings, without
        loading anything (the app's health view answers with it while the models load)."""
        return PromptParams.of(system_prompt=rag.system_prompt, top_k=rag.top_k,
                               model=models.llm_name, block_size=BLOCK_SIZE)

    def close(self) -> None:
        self.store.close()

    def count_embedding(self, stats: Counter) -> None:
        """Add the indexer's embedding time (`embed_ms`) to `stats`, the app's counters:
        indexing time splits into embedding and the rest (the texts: `chunks_embedded`)."""
        self.indexer.embedder = TimedEmbedder(self.indexer.embedder, stats)

    def prompt_params(self) -> PromptParams:
        return PromptParams.of(system_prompt=self.prompts.system_prompt,
                               top_k=self.retriever.top_k, model=self.model_salt,
                               block_size=self.block_size)

    def index(self, change: KbChange) -> dict[str, str] | None:
        return self.index_many([change])[0]

    def index_many(self, changes: Sequence[KbChange]) -> list[dict[str, str] | None]:
        results = self.indexer.index_documents(changes)
        self._embedded += sum(r.embedded for r in results)
        if self.replicated:
            for r in results:
                if r.applied:
                    self._outgoing.extend(self._replica_records(r))
        return [{c.chunk_id: c.content_hash for c in r.chunks} if r.applied else None
                for r in results]

    # --- the index replica (streams.shell.replica) -----------------------------------------
    def take_outgoing(self) -> tuple[list[Outgoing], int]:
        """The rag.chunks records of what was indexed since the last call, and how many
        chunk embeddings that computed."""
        out, embedded = self._outgoing, self._embedded
        self._outgoing, self._embedded = [], 0
        return out, embedded

    def apply_replicated(self, records: Sequence[ReplicaRecord]) -> dict[str, int]:
        return vars(replica.apply_batch(self.store, records))

    def replica_offsets(self, name: str) -> dict[int, int]:
        return self.store.replica_offsets(name)

    def save_replica_offsets(self, name: str, offsets: dict[int, int]) -> None:
        self.store.save_replica_offsets(name, offsets)

    def _replica_records(self, result: IndexResult) -> list[Outgoing]:
        record = self.store.doc_record(result.doc_id, result.tenant)
        assert record is not None  # just written
        vectors = self.store.vectors_by_hash(c.content_hash for c in result.chunks)
        missing = [c.chunk_id for c in result.chunks if c.content_hash not in vectors]
        if missing:  # a store written before vectors were kept by hash
            vectors.update(self.store.chunk_vectors(missing, result.tenant))
        removed = [r.chunk_id for r in result.diff.removed]
        return replica.outgoing(record, result.chunks, vectors, removed)

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        hits = self.retriever.retrieve(question, tenant).chunks
        return self._prefix(hits, tenant) if hits else None

    def prefixes_for_questions(
        self, questions: Sequence[str], tenant: str
    ) -> list[WarmPrefix | None]:
        """`prefix_for_question` of each, the questions embedded as one batch."""
        found = self.retriever.retrieve_many(questions, tenant)
        return [self._prefix(r.chunks, tenant) if r.chunks else None for r in found]

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None:
        stored = self.store.get_chunks([r.chunk_id for r in refs], tenant)
        chunks = []
        for ref in refs:
            hit = stored.get(ref.chunk_id)
            if hit is None or hit.chunk.content_hash != ref.content_hash:
                return None
            chunks.append(hit.chunk)
        return self._prefix(chunks, tenant) if chunks else None

    def synthesis_prompt(
        self, refs: Sequence[ChunkRef], tenant: str, max_tokens: int
    ) -> SynthesisPrompt | None:
        stored = self.store.get_chunks([r.chunk_id for r in refs], tenant)
        chunks = [
            stored[r.chunk_id].chunk for r in refs
            if r.chunk_id in stored and stored[r.chunk_id].chunk.content_hash == r.content_hash
        ]
        if not chunks:
            return None
        token_ids, primer = self.prompts.question_prompt(chunks, max_tokens)
        refs = [ChunkRef(chunk_id=c.chunk_id, content_hash=c.content_hash) for c in chunks]
        return SynthesisPrompt(token_ids, refs, primer)

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool:
        stored = self.store.get_chunks([r.chunk_id for r in refs], tenant)
        held = {cid: (s.chunk.content_hash, s.version) for cid, s in stored.items()}
        stale = stale_refs(refs, held)
        if stale:
            # Which chunk moved on, and to what: a warm op skipped as stale says why here
            # (once at info level per distinct report, then at debug).
            key = (tenant, tuple(stale))
            level = logging.DEBUG if key in self._stale_logged else logging.INFO
            if len(self._stale_logged) > 4096:
                self._stale_logged.clear()  # bounded: a long-running app sees many edits
            self._stale_logged.add(key)
            log.log(level, "stale refs for tenant %s (chunk id, wanted, stored, version): %s",
                    tenant, [(c, w[:12], h and h[:12], v) for c, w, h, v in stale])
        return not stale

    def chunk_tokens(self, refs: Sequence[ChunkRef], tenant: str) -> dict[str, list[int]]:
        stored = self.store.get_chunks([r.chunk_id for r in refs], tenant)
        return {
            r.chunk_id: self.prompts.chunk_ids(stored[r.chunk_id].chunk)
            for r in refs
            if r.chunk_id in stored and stored[r.chunk_id].chunk.content_hash == r.content_hash
        }

    def opening_ids(self) -> list[int]:
        return self.prompts.opening_ids()

    def question_ids(self, question: str) -> list[int]:
        return self.prompts.question_ids(question)

    def search(self, question: str, tenant: str, k: int) -> list[dict]:
        hits = self.retriever.retrieve(question, tenant, k).hits
        return [
            {
                "chunk_id": hit.chunk.chunk_id,
                "content_hash": hit.chunk.content_hash,
                "doc_id": hit.chunk.doc_id,
                "text": hit.chunk.text,
                "score": hit.score,
                "version": hit.version,
            }
            for hit in hits
        ]

    def indexed_versions(self) -> dict[tuple[str, str], int | None]:
        return {(r.tenant, r.doc_id): r.version for r in self.store.doc_records()}

    def _prefix(self, chunks, tenant: str) -> WarmPrefix | None:
        tokens, places = self.prompts.prefix_with_spans(chunks)
        chain = prefix_chain(
            tokens, tenant=tenant, model=self.model_salt, block_size=self.block_size
        )
        if chain.prefix_hash is None:
            return None  # shorter than one block: nothing a worker could cache
        refs = [ChunkRef(chunk_id=c.chunk_id, content_hash=c.content_hash) for c in chunks]
        spans = [ChunkSpan(chunk_id=c.chunk_id, content_hash=c.content_hash, start=a, end=b)
                 for c, (a, b) in zip(canonical_order(chunks), places, strict=True)]
        return WarmPrefix(prefix_hash=chain.prefix_hash, token_ids=tokens, chunk_refs=refs,
                          chunk_spans=spans)
