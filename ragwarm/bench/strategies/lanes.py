"""One policy's lane: its worker over any engine, its policy, and the RAG port it sees.

The benchmark (torch engine, real store) and `replay --evaluate` (cost engine, query log)
both open their lanes here, so a policy is built and fed the same way in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ragwarm.bench.strategies.policies import Policy, PolicyContext, SimClock
from ragwarm.bench.strategies.settings import StrategySettings
from streams.decide.records import DocState
from streams.sim import SimRag
from workers.sim import SimWorker

if TYPE_CHECKING:
    from ragwarm.rag_port import RagService
    from ragwarm.trace import Question


@dataclass
class Lane:
    policy: Policy
    worker: SimWorker


def open_lane(cls: type[Policy], engine: Any, clock: SimClock, rag: SimRag,
              settings: StrategySettings, past: Sequence[Question], *,
              ttft_runs: int) -> Lane:
    """The policy `cls` over a worker as deployed (runtime, commands, request caching when
    the policy keeps it) on `engine`: the torch engine or the model-free cost engine."""
    worker = SimWorker(engine, clock, worker_id=f"sim-{cls.name}",
                       cache_requests=cls.cache_requests, ttft_runs=ttft_runs,
                       chunk_reuse=cls.chunk_reuse)
    return Lane(cls(PolicyContext(worker, rag, settings, clock, past)), worker)


def store_doc_states(rag: RagService, tenant: str) -> dict[str, dict]:
    """The `docs` table as the KB-change agent leaves it after the store's initial state."""
    store = rag.store
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


def store_rag(rag: RagService) -> SimRag:
    """The benchmark's RAG port for policies: the shared store and retrieval."""
    return SimRag(rag, partial(store_doc_states, rag))
