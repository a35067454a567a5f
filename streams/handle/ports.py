"""What the streams app needs from the RAG layer, as a protocol the wiring fills in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from schemas import ChunkRef, KbChange
from schemas.chunks import Outgoing, ReplicaRecord
from schemas.events import ChunkSpan
from schemas.prefix import PromptParams
from streams.decide.synthetic import SynthesisPrompt


@dataclass(frozen=True)
class WarmPrefix:
    """A canonical prompt prefix ready to prefill: its identity, tokens and sources."""

    prefix_hash: str
    token_ids: list[int]
    chunk_refs: list[ChunkRef]
    # Where each chunk stands in `token_ids` (the prompt builder knows): the prefill
    # carries them so the worker donates the chunks' KV on arrival. Empty: not known.
    chunk_spans: list[ChunkSpan] = field(default_factory=list)


class RagPort(Protocol):
    def index(self, change: KbChange) -> dict[str, str] | None:
        """Apply the change to the store; chunk_id -> hash after it, None if it was older."""

    def index_many(self, changes: Sequence[KbChange]) -> list[dict[str, str] | None]:
        """`index` for each change in order, embedding the new chunks of all together."""

    def prefix_for_question(self, question: str, tenant: str) -> WarmPrefix | None:
        """Retrieve the top-k for `question` now and build its canonical prefix."""

    def prefix_for_refs(self, refs: Sequence[ChunkRef], tenant: str) -> WarmPrefix | None:
        """Rebuild the prefix of these exact chunks; None if any is no longer current."""

    def refs_current(self, refs: Sequence[ChunkRef], tenant: str) -> bool:
        """Whether every ref's content hash is still the current one of its chunk."""

    def chunk_tokens(self, refs: Sequence[ChunkRef], tenant: str) -> dict[str, list[int]]:
        """chunk_id -> the tokens of its block in a canonical prompt, for the refs still
        current (what a worker computes the chunk's KV from)."""

    def opening_ids(self) -> list[int]:
        """The canonical prompt's tokens before its first chunk (the system prompt)."""

    def question_ids(self, question: str) -> list[int]:
        """The canonical prompt's tokens after its prefix for `question` (its last ones)."""

    def synthesis_prompt(
        self, refs: Sequence[ChunkRef], tenant: str, max_tokens: int
    ) -> SynthesisPrompt | None:
        """The question prompt over the current ones of these chunks (their text cut to
        `max_tokens` tokens); None when none of them is current."""

    def search(self, question: str, tenant: str, k: int) -> list[dict]:
        """Top-k chunks of `tenant` with text and score, for clients that reach the store
        through us (always one tenant: a retrieval never mixes tenants)."""

    def indexed_versions(self) -> dict[tuple[str, str], int | None]:
        """(tenant, doc_id) -> the version the index holds (index recovery compares it
        with the docs table)."""

    def prompt_params(self) -> PromptParams:
        """What the canonical prompts are built with; clients must build theirs alike."""


class ReplicaStore(Protocol):
    """What the index replica (`streams.shell.replica`) needs from the RAG layer's store."""

    def take_outgoing(self) -> tuple[list[Outgoing], int]:
        """The rag.chunks records of what was indexed since the last call (none with a
        shared Qdrant server), and how many chunk embeddings that computed."""

    def apply_replicated(self, records: Sequence[ReplicaRecord]) -> Mapping[str, int]:
        """Apply rag.chunks records in order; counts of what was written, deleted, skipped."""

    def replica_offsets(self, name: str) -> dict[int, int]:
        """partition -> next offset of topic `name` the store has applied."""

    def save_replica_offsets(self, name: str, offsets: dict[int, int]) -> None:
        """Record the offsets after the records before them were applied."""


class IndexReplica(Protocol):
    """The handlers' view of the replica: publish what was indexed, catch up on demand."""

    async def publish(self) -> None:
        """Send what this instance indexed since the last call, acknowledged by the broker."""

    async def caught_up(self, timeout_s: float | None = None, since: float | None = None) -> bool:
        """Wait until the local index holds everything published on rag.chunks so far (False
        when that took longer than allowed); `since`: when the inputs being handled arrived
        (`streams.handle.catchup`), a catch-up begun after it is reused."""
