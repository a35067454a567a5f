"""The canonical RAG prompt: system prompt + chunks in canonical order + question, as token ids.

This is the only implementation; warmup and the RAG client both call it, so the prefix a
worker prefilled is exactly the prefix a query sends. Each part is tokenized on its own
and the ids are concatenated: the prefix never depends on the question, and re-tokenizing
a joined string (which can merge tokens across the boundary) never happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from rag.chunking import Tokenizer, split_chunk_id
from rag.settings import DEFAULT_SYSTEM_PROMPT
from schemas import ChunkRef

# Stand-ins rendered through a chat template to find where our parts go.
_SYSTEM_MARK = "\x00RAGWARM-SYSTEM\x00"
_USER_MARK = "\x00RAGWARM-USER\x00"
CONTEXT_HEADER = "\n\nContext:\n"
# Synthetic warmup's prompt: the model asks a question a user would ask of a text. Its
# answer is opened with a cue: a small model told to write a question often writes
# something else (an answer, a heading); after "How do I" it writes the rest of a question.
QUESTION_SYSTEM = (
    "You are a user of this software. You ask short questions about its documentation."
)
QUESTION_REQUEST = "Ask one short question about this documentation."
QUESTION_PRIMER = "How do I"


class ChunkLike(Protocol):
    """Anything with a chunk's identity and text (`Chunk`, or a chunk read back from the store)."""

    @property
    def chunk_id(self) -> str: ...

    @property
    def content_hash(self) -> str: ...

    @property
    def text(self) -> str: ...


C = TypeVar("C", bound=ChunkLike)


@dataclass(frozen=True)
class Prompt:
    """A full prompt; `token_ids[:prefix_len]` is the warmable prefix, the rest is the question."""

    token_ids: tuple[int, ...]
    prefix_len: int
    text: str
    prefix_text: str
    chunk_refs: tuple[ChunkRef, ...]
    # Token [start, end) of each chunk's block, in the order of `chunk_refs`: where a worker
    # may place the chunk's own KV (chunk-level reuse).
    chunk_spans: tuple[tuple[int, int], ...] = ()

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        return self.token_ids[: self.prefix_len]

    @property
    def question_ids(self) -> tuple[int, ...]:
        return self.token_ids[self.prefix_len :]


@dataclass(frozen=True)
class Layout:
    """The fixed text around our parts: before the system prompt, between context and question,
    and after the question (the generation cue)."""

    head: str
    between: str
    tail: str

    @classmethod
    def plain(cls) -> Layout:
        return cls(head="", between="\n\nQuestion: ", tail="\nAnswer:")


def chat_layout(tokenizer: Any) -> Layout:
    """The layout of the tokenizer's chat template (system, user, generation prompt), or the
    plain one when the tokenizer has no template or the template moves our parts around."""
    if not getattr(tokenizer, "chat_template", None):
        return Layout.plain()
    messages = [
        {"role": "system", "content": _SYSTEM_MARK},
        {"role": "user", "content": _USER_MARK},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(rendered, str) or rendered.count(_SYSTEM_MARK) != 1:
        return Layout.plain()
    head, _, rest = rendered.partition(_SYSTEM_MARK)
    if rest.count(_USER_MARK) != 1:
        return Layout.plain()
    between, _, tail = rest.partition(_USER_MARK)
    return Layout(head=head, between=between, tail=tail)


def canonical_order(chunks: Sequence[C]) -> list[C]:
    """Chunks sorted by (doc_id, ordinal, content_hash), duplicates dropped: one order per set."""
    unique = {(c.chunk_id, c.content_hash): c for c in chunks}
    return [unique[k] for k in sorted(unique, key=_sort_key)]


def chunk_block(chunk: ChunkLike) -> str:
    return f"\n[{chunk.chunk_id}]\n{chunk.text}\n"


class PromptBuilder:
    """Builds canonical prompts for one tokenizer and system prompt (the layout is cached)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        layout: Layout | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.layout = layout or chat_layout(tokenizer)

    def prefix_parts(self, chunks: Sequence[ChunkLike]) -> list[str]:
        """The prefix as the texts tokenized one by one, chunks in canonical order."""
        blocks = [chunk_block(c) for c in canonical_order(chunks)]
        return [self.opening(), *blocks, self.layout.between]

    def opening(self) -> str:
        """The text before the first chunk: what a chunk's own KV is computed after."""
        return self.layout.head + self.system_prompt + CONTEXT_HEADER

    def opening_ids(self) -> list[int]:
        return self._encode(self.opening())

    def chunk_ids(self, chunk: ChunkLike) -> list[int]:
        """The tokens of `chunk`'s block, as every prompt holding it has them."""
        return self._encode(chunk_block(chunk))

    def build_prefix(self, chunks: Sequence[ChunkLike]) -> list[int]:
        """The prefix token ids a worker prefills for this chunk set."""
        return self.prefix_with_spans(chunks)[0]

    def prefix_with_spans(
        self, chunks: Sequence[ChunkLike]
    ) -> tuple[list[int], tuple[tuple[int, int], ...]]:
        """`build_prefix(chunks)`, and token [start, end) of each chunk's block in it (in
        canonical order): where a warm prefix's chunks stand, for the worker to donate."""
        encoded = [self._encode(part) for part in self.prefix_parts(chunks)]
        spans, start = [], len(encoded[0])
        for ids in encoded[1:-1]:
            spans.append((start, start + len(ids)))
            start += len(ids)
        return [t for ids in encoded for t in ids], tuple(spans)

    def question_ids(self, question: str) -> list[int]:
        """The tokens after the prefix for `question`: they depend on it alone."""
        return self._encode(question.strip() + self.layout.tail)

    def build(self, chunks: Sequence[ChunkLike], question: str) -> Prompt:
        """The full prompt; its first `prefix_len` ids equal `build_prefix(chunks)`."""
        prefix, spans = self.prefix_with_spans(chunks)
        asked = question.strip() + self.layout.tail
        prefix_text = "".join(self.prefix_parts(chunks))
        return Prompt(
            token_ids=tuple(prefix + self.question_ids(question)),
            prefix_len=len(prefix),
            text=prefix_text + asked,
            prefix_text=prefix_text,
            chunk_refs=tuple(_ref(c) for c in canonical_order(chunks)),
            chunk_spans=spans,
        )

    def question_prompt(
        self, chunks: Sequence[ChunkLike], max_tokens: int
    ) -> tuple[list[int], int]:
        """The prompt that asks the model for one question a user might ask about `chunks`
        (synthetic warmup), their text in canonical order cut to `max_tokens` tokens; and
        how many of its last tokens are the cue that opens the answer."""
        text = "\n\n".join(c.text.strip() for c in canonical_order(chunks))
        excerpt = self.tokenizer.decode(self._encode(text)[:max_tokens]).strip()
        user = f"Documentation:\n{excerpt}\n\n{QUESTION_REQUEST}"
        rendered = self.layout.head + QUESTION_SYSTEM + self.layout.between + user
        primer = self._encode(QUESTION_PRIMER)
        return self._encode(rendered + self.layout.tail) + primer, len(primer)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def build_prompt(
    chunks: Sequence[ChunkLike],
    question: str,
    tokenizer: Tokenizer,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
) -> Prompt:
    """One-off form of `PromptBuilder(tokenizer, system_prompt).build(chunks, question)`."""
    return PromptBuilder(tokenizer, system_prompt).build(chunks, question)


def build_prefix(
    chunks: Sequence[ChunkLike], tokenizer: Tokenizer, system_prompt: str = DEFAULT_SYSTEM_PROMPT
) -> list[int]:
    """One-off form of `PromptBuilder(tokenizer, system_prompt).build_prefix(chunks)`."""
    return PromptBuilder(tokenizer, system_prompt).build_prefix(chunks)


def _sort_key(key: tuple[str, str]) -> tuple[str, int, str, str]:
    chunk_id, content_hash = key
    try:
        doc_id, ordinal = split_chunk_id(chunk_id)
    except ValueError:
        # Ids not of the `doc#n` form still get one order, after any numbered sibling.
        return (chunk_id, 1 << 62, chunk_id, content_hash)
    return (doc_id, ordinal, chunk_id, content_hash)


def _ref(chunk: ChunkLike) -> ChunkRef:
    return ChunkRef(chunk_id=chunk.chunk_id, content_hash=chunk.content_hash)
