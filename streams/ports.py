"""What the streams app needs from the RAG layer, as a protocol the wiring fills in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from schemas import ChunkRef, KbChange
from schemas.prefix import PromptParams


@dataclass(frozen=True)
class WarmPrefix:
    """A canonical prompt prefix ready to prefill: its identity, tokens and sources."""

    prefix_hash: str
    token_ids: list[int]
    chunk_refs: list[ChunkRef]


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

    def search(self, question: str, tenant: str, k: int) -> list[dict]:
        """Top-k chunks of `tenant` with text and score, for clients that reach the store
        through us (always one tenant: a retrieval never mixes tenants)."""

    def indexed_versions(self) -> dict[tuple[str, str], int | None]:
        """(tenant, doc_id) -> the version the index holds (index recovery compares it
        with the docs table)."""

    def prompt_params(self) -> PromptParams:
        """What the canonical prompts are built with; clients must build theirs alike."""
