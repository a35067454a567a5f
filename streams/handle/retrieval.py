"""Several questions' prefixes in one store call: their embeddings computed as one batch.

Why: an edit re-warms up to `rewarm_questions` questions, the edit watch re-checks up to
`edit_recheck_questions`, and a hot tick warms every prefix new to the hot set; one at a
time, each paid a whole pass of the embedder (about 30 ms on a quiet core, 150+ ms on the
loaded 2-vCPU machine, docs/lab/benchmarks-notebook.md) and queued once more on the store's
one thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas import ChunkRef
from streams.decide.hot import HotPayload
from streams.handle.deps import HandlerDeps
from streams.handle.ports import RagPort, WarmPrefix

# Questions per store call: one embedder pass each, short enough that a call an edit is
# waiting on (`streams.decide.priority`) never queues long behind a background batch.
BATCH = 8


def prefixes_for_questions(
    rag: RagPort, questions: Sequence[str], tenant: str
) -> list[WarmPrefix | None]:
    """Per question, the prefix its top-k builds now (None: nothing retrieved). Batched
    where the port offers `prefixes_for_questions` (the real store), else one by one."""
    many = getattr(rag, "prefixes_for_questions", None)
    if many is not None:
        return list(many(list(questions), tenant))
    return [rag.prefix_for_question(q, tenant) for q in questions]


def batches(items: Sequence, size: int = BATCH) -> list[Sequence]:
    """`items` in consecutive slices of at most `size` (none when empty)."""
    return [items[i:i + size] for i in range(0, len(items), max(1, size))]


def prefixes_for_refs(
    rag: RagPort, wanted: Sequence[tuple[Sequence[ChunkRef], str]]
) -> list[WarmPrefix | None]:
    """`prefix_for_refs` of each (refs, tenant), in one store call."""
    return [rag.prefix_for_refs(refs, tenant) for refs, tenant in wanted]


async def hot_prefixes(
    p: HandlerDeps, payloads: dict[str, HotPayload]
) -> dict[str, WarmPrefix | None]:
    """Per hot prefix hash, the prefix to warm for it: the one its query's chunks build
    while they are current, else what its question retrieves now (None: nothing). The
    caller has caught the index replica up."""
    if not payloads:
        return {}
    items = list(payloads.items())
    found: dict[str, WarmPrefix | None] = {}
    asks: dict[str, list[tuple[str, str]]] = {}  # tenant -> (prefix hash, question)
    for batch in batches(items):
        wanted = [(list(pl.chunk_refs), pl.tenant) for _, pl in batch]
        built = await p.blocking(prefixes_for_refs, p.rag, wanted)
        for (prefix_hash, payload), prefix in zip(batch, built, strict=True):
            if prefix is not None and prefix.prefix_hash == prefix_hash:
                found[prefix_hash] = prefix
            else:  # the query's chunks changed since it was asked
                asks.setdefault(payload.tenant, []).append((prefix_hash, payload.question))
    for tenant, pending in asks.items():
        for batch in batches(pending):
            questions = [q for _, q in batch]
            built = await p.blocking(prefixes_for_questions, p.rag, questions, tenant)
            found.update((h, prefix) for (h, _), prefix in zip(batch, built, strict=True))
    return found
