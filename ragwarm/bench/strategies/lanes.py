"""One policy's lane: its worker over any engine, its policy, and the RAG port it sees.

The benchmark (torch engine, real store) and `replay --evaluate` (cost engine, query log)
both open their lanes here, so a policy is built and fed the same way in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragwarm.bench.strategies.policies import Policy, PolicyContext, PolicyRag
from ragwarm.bench.strategies.settings import StrategySettings
from ragwarm.bench.strategies.worker import SimWorker
from schemas.prefix import PromptParams
from streams.ports import SynthesisPrompt, WarmPrefix
from streams.records import DocState

if TYPE_CHECKING:
    from rag.trace import Question
    from ragwarm.rag_port import RagService
    from schemas import ChunkRef


class SimClock:
    """Simulated seconds since the start of the run; caches and policies read it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Lane:
    policy: Policy
    worker: SimWorker


def open_lane(cls: type[Policy], engine: Any, clock: SimClock, rag: PolicyRag,
              settings: StrategySettings, past: Sequence[Question], *,
              ttft_runs: int) -> Lane:
    """The policy `cls` over a worker as deployed (runtime, commands, request caching when
    the policy keeps it) on `engine`: the torch engine or the model-free cost engine."""
    worker = SimWorker(engine, clock, worker_id=f"sim-{cls.name}",
                       cache_requests=cls.cache_requests, ttft_runs=ttft_runs,
                       chunk_reuse=cls.chunk_reuse)
    return Lane(cls(PolicyContext(worker, rag, settings, clock, past)), worker)


class StoreRag:
    """The benchmark's RAG port for policies: the shared store and retrieval."""

    def __init__(self, rag: RagService) -> None:
        self.rag = rag

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        return self.rag.prefix_for_question(question, tenant)

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None:
        return self.rag.prefix_for_refs(refs, tenant)

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool:
        return self.rag.refs_current(refs, tenant)

    def chunk_tokens(self, refs: Sequence[ChunkRef], tenant: str) -> dict[str, list[int]]:
        return self.rag.chunk_tokens(refs, tenant)

    def opening_ids(self) -> list[int]:
        return self.rag.opening_ids()

    def question_ids(self, question: str) -> list[int]:
        return self.rag.question_ids(question)

    def search(self, question: str, tenant: str, k: int) -> list[dict]:
        return self.rag.search(question, tenant, k)

    def prompt_params(self) -> PromptParams:
        return self.rag.prompt_params()

    def synthesis_prompt(
        self, refs: Sequence[ChunkRef], tenant: str, max_tokens: int
    ) -> SynthesisPrompt | None:
        return self.rag.synthesis_prompt(refs, tenant, max_tokens)

    def doc_states(self, tenant: str) -> dict[str, dict]:
        """The `docs` table as the KB-change agent leaves it after the initial state."""
        store = self.rag.store
        chunks: dict[str, dict[str, str]] = {}
        for stored in store.all_chunks(tenant):
            chunks.setdefault(stored.chunk.doc_id, {})[stored.chunk.chunk_id] = (
                stored.chunk.content_hash
            )
        return {
            r.doc_id: DocState(
                version=r.version, tenant=tenant, chunks=chunks.get(r.doc_id, {}),
                deleted=r.deleted,
            ).model_dump(mode="json")
            for r in store.doc_records(tenant)
            if r.version is not None  # a first write still under way has no version yet
        }
