"""The RAG layer as a query log shows it, for policies replayed without a model (pure).

A logged query carries its chunk refs, its prefix's block chain and token counts, not its
tokens. Each logged block hash stands for one block of synthetic token ids derived from
it, so prompts that shared blocks share them again and the worker's cache matches them as
it matched the real ones; the question's tokens derive from the question. Retrieval is
what the log last showed for a question; a chunk whose content hash changes in the log is
a KB change of its document, seen just before the first query that shows it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragwarm.trace import Question
from schemas import ChunkRef, KbChange, QueryEvent
from schemas.prefix import PromptParams
from streams.decide.records import DocState
from streams.decide.synthetic import SynthesisPrompt
from streams.handle.ports import WarmPrefix

Hasher = Callable[[Sequence[int], str], list[str]]  # token ids, tenant -> block chain


@dataclass(frozen=True)
class LoggedPrompt:
    """A logged query's synthetic prompt: prefix tokens, then the question's."""

    token_ids: list[int]
    prefix: WarmPrefix | None
    prefix_hashes: list[str]


@dataclass(frozen=True)
class LoggedIndex:
    """What indexing a document gave, as far as the log knows its chunks."""

    chunks: list[ChunkRef]
    applied: bool = True
    content_changed: bool = True


def synthetic_tokens(seed: str, n: int) -> list[int]:
    """`n` token ids derived from `seed` (16 per SHA-256 digest)."""
    out: list[int] = []
    i = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{seed}/{i}".encode()).digest()
        out += [int.from_bytes(digest[k : k + 2], "big") for k in range(0, 32, 2)]
        i += 1
    return out[:n]


def log_questions(events: Sequence[QueryEvent]) -> list[Question]:
    """The log's distinct questions, most asked first (ties: first asked first)."""
    counts: dict[str, int] = {}
    for e in events:
        counts[e.question] = counts.get(e.question, 0) + 1
    ranked = sorted(counts, key=lambda q: -counts[q])
    return [Question(qid=hashlib.sha256(q.encode()).hexdigest()[:16], question=q) for q in ranked]


class LogRag:
    """A `PolicyRag` over a query log: prompts, retrieval and chunk state as logged."""

    def __init__(self, events: Sequence[QueryEvent], *, tenant: str, hasher: Hasher,
                 block_size: int, model: str) -> None:
        self.tenant = tenant
        self.hasher = hasher
        self.block_size = block_size
        self.model = model  # the model salt of `hasher`'s chains
        self.top_k = max((len(e.chunk_refs) for e in events), default=0)
        self.current: dict[str, str] = {}  # chunk id -> content hash as last logged
        self.docs: dict[str, set[str]] = {}  # doc id -> its chunk ids seen so far
        self.versions: dict[str, int] = {}
        self.by_question: dict[str, WarmPrefix] = {}
        self.by_refs: dict[frozenset[tuple[str, str]], WarmPrefix] = {}
        # The start: every chunk and question as first logged.
        for event in events:
            for ref in event.chunk_refs:
                self.current.setdefault(ref.chunk_id, ref.content_hash)
                self.docs.setdefault(ref.doc_id, set()).add(ref.chunk_id)
            prefix = self.prompt(event).prefix
            if prefix is not None:
                self.by_question.setdefault(event.question, prefix)
                self.by_refs.setdefault(_key(event.chunk_refs), prefix)

    # -- the log, one query at a time --------------------------------------------------

    def prompt(self, event: QueryEvent) -> LoggedPrompt:
        """The synthetic prompt of a logged query (the same for the same logged blocks)."""
        bs = self.block_size
        blocks = event.prefix_tokens // bs
        chain = list(event.block_hashes[:blocks])
        if len(chain) < blocks:  # no chain logged: the prefix stands for itself
            seed = event.prefix_hash or ",".join(sorted(r.chunk_id for r in event.chunk_refs))
            chain = [f"{seed}/{i}" for i in range(blocks)]
        tail_seed = chain[-1] if chain else ",".join(f"{r.chunk_id}" for r in event.chunk_refs)
        prefix_ids = [t for h in chain for t in synthetic_tokens(h, bs)]
        prefix_ids += synthetic_tokens(f"{tail_seed}/tail", event.prefix_tokens - blocks * bs)
        asked = max(1, event.prompt_tokens - event.prefix_tokens)
        question_ids = synthetic_tokens(f"{tail_seed}/{event.question}", asked)
        hashes = self.hasher(prefix_ids, self.tenant)
        prefix = WarmPrefix(hashes[-1], prefix_ids, list(event.chunk_refs)) if hashes else None
        return LoggedPrompt(prefix_ids + question_ids, prefix, hashes)

    def observe(self, event: QueryEvent) -> list[tuple[KbChange, LoggedIndex]]:
        """Learn what `event` retrieved; the KB changes its chunk hashes reveal."""
        changed: set[str] = set()
        for ref in event.chunk_refs:
            self.docs.setdefault(ref.doc_id, set()).add(ref.chunk_id)
            if self.current.get(ref.chunk_id) != ref.content_hash:
                changed.add(ref.doc_id)
            self.current[ref.chunk_id] = ref.content_hash
        prefix = self.prompt(event).prefix
        if prefix is not None:
            self.by_question[event.question] = prefix
            self.by_refs[_key(event.chunk_refs)] = prefix
        return [self._change(doc) for doc in sorted(changed)]

    def _change(self, doc_id: str) -> tuple[KbChange, LoggedIndex]:
        self.versions[doc_id] = self.versions.get(doc_id, 0) + 1
        change = KbChange(op="upsert", doc_id=doc_id, version=self.versions[doc_id],
                          tenant=self.tenant, text="")
        chunks = [ChunkRef(chunk_id=c, content_hash=self.current[c])
                  for c in sorted(self.docs[doc_id])]
        return change, LoggedIndex(chunks)

    def event(self, event: QueryEvent, prompt: LoggedPrompt, cached: int,
              ttft_ms: float | None) -> QueryEvent:
        """What the RAG client would publish for `event` answered from this replay."""
        return event.model_copy(update={
            "tenant": self.tenant,
            "prefix_hash": prompt.prefix.prefix_hash if prompt.prefix else None,
            "block_hashes": prompt.prefix_hashes, "cached_tokens": cached, "ttft_ms": ttft_ms,
        })

    # -- the policies' RAG port ---------------------------------------------------------

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        return self.by_question.get(question)

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None:
        if not self.refs_current(refs, tenant):
            return None
        return self.by_refs.get(_key(refs))

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool:
        return all(self.current.get(r.chunk_id) == r.content_hash for r in refs)

    def chunk_tokens(self, refs: Sequence[ChunkRef], tenant: str) -> dict[str, list[int]]:
        return {}  # no chunk text in a query log: nothing to warm chunk by chunk

    def opening_ids(self) -> list[int]:
        return []

    def question_ids(self, question: str) -> list[int]:
        return []  # no prompt text in a query log: prefixes are warmed without questions

    def search(self, question: str, tenant: str, k: int) -> list[dict]:
        return []  # no text in a query log

    def prompt_params(self) -> PromptParams:
        """What the replayed prompts are made of: no system prompt text (the log holds none;
        prompts are rebuilt from its block hashes), the most chunks a logged query had."""
        return PromptParams.of(system_prompt="", top_k=self.top_k, model=self.model,
                               block_size=self.block_size)

    def synthesis_prompt(
        self, refs: Sequence[ChunkRef], tenant: str, max_tokens: int
    ) -> SynthesisPrompt | None:
        return None  # a query log holds no document text to ask about

    def doc_states(self, tenant: str) -> dict[str, dict]:
        """The `docs` table at the start: each document's chunks as first logged."""
        return {
            doc: DocState(version=0, tenant=tenant,
                          chunks={c: self.current[c] for c in chunks}).model_dump(mode="json")
            for doc, chunks in self.docs.items()
        }


def _key(refs: Sequence[ChunkRef]) -> frozenset[tuple[str, str]]:
    return frozenset((r.chunk_id, r.content_hash) for r in refs)
