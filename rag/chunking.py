"""Deterministic, token-aware, markdown-aware chunking of documents into `doc_id#ordinal` chunks."""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from schemas import ChunkRef

# Chunks never span a heading of this level or above, so an edit in one top-level
# section leaves the chunks of the other sections (and their embeddings) untouched.
HARD_HEADING_LEVEL = 2
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:\s|$)")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_SEPARATORS = ("\n", ". ", " ")
# The blank line joining two units, and the merges it causes, cost up to about two tokens.
_JOIN_TOKENS = 2


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer that chunking and prompts use."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def __hash__(self) -> int: ...  # `count_tokens` remembers counts per tokenizer


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """LLM tokens of `text`, remembered for the last 50,000 (tokenizer, text) pairs.

    An edit re-chunks its whole document, and nearly all of its blocks and chunk bodies are
    the same texts as before; encoding them again was most of the time indexing spent
    outside the embedder (issue 14: `kb_chunks_per_s` against `embed_chunks_per_s`).
    Tokenizers are keyed by identity and kept alive by the cache: a process loads one.
    """
    return _count_tokens(tokenizer, text)


@functools.lru_cache(maxsize=50_000)
def _count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def normalize(text: str) -> str:
    """The canonical form of chunk text: NFC, `\\n` line ends, no trailing spaces or blank edges."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def content_hash(text: str) -> str:
    """sha256 (hex) of the normalized text: the chunk identity warm prefixes depend on."""
    return hashlib.sha256(normalize(text).encode("utf-8")).hexdigest()


def chunk_id(doc_id: str, ordinal: int) -> str:
    return f"{doc_id}#{ordinal}"


def split_chunk_id(value: str) -> tuple[str, int]:
    """`doc_id#ordinal` back into its parts (doc ids may contain `#` themselves)."""
    doc_id, sep, ordinal = value.rpartition("#")
    if not sep or not ordinal.isdigit():
        raise ValueError(f"not a chunk id (doc_id#ordinal): {value!r}")
    return doc_id, int(ordinal)


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document; `text` is already normalized."""

    doc_id: str
    ordinal: int
    text: str
    content_hash: str
    tokens: int

    @property
    def chunk_id(self) -> str:
        return chunk_id(self.doc_id, self.ordinal)

    @property
    def ref(self) -> ChunkRef:
        return ChunkRef(chunk_id=self.chunk_id, content_hash=self.content_hash)


@dataclass(frozen=True)
class _Unit:
    """An indivisible piece of a document: a heading, a paragraph, or a fenced code block."""

    text: str
    tokens: int
    heading: int = 0  # heading level, 0 for other units
    code: bool = False


def chunk_document(
    doc_id: str, text: str, tokenizer: Tokenizer, max_tokens: int = 256, overlap: int = 0
) -> list[Chunk]:
    """Split a document into chunks of at most about `max_tokens` LLM tokens.

    Blocks (headings, paragraphs, fenced code) are packed greedily; chunks break before
    top-level headings, prefer to break before lower headings, and split a block only
    when it alone exceeds the budget (code is then re-fenced piece by piece).
    """
    if overlap >= max_tokens:
        raise ValueError("overlap must be smaller than max_tokens")
    # Split blocks leave room for the overlap, so a carried tail always fits beside them.
    budget = max_tokens - overlap
    units = [u for block in _blocks(normalize(text)) for u in _units(block, tokenizer, budget)]
    pieces: list[str] = []
    for section in _sections(units):
        pieces.extend(_pack(section, tokenizer, max_tokens, overlap))
    chunks: list[Chunk] = []
    for piece in pieces:
        body = normalize(piece)
        if body:
            chunks.append(
                Chunk(doc_id, len(chunks), body, content_hash(body), count_tokens(tokenizer, body))
            )
    return chunks


def _blocks(text: str) -> list[tuple[str, int, bool]]:
    """(text, heading level, is code) for each markdown block, in document order."""
    blocks: list[tuple[str, int, bool]] = []
    para: list[str] = []
    fence: list[str] = []
    closer = ""
    for line in text.split("\n"):
        if fence:
            fence.append(line)
            if line.strip().startswith(closer) and not line.strip().strip(closer[0]):
                blocks.append(("\n".join(fence), 0, True))
                fence = []
            continue
        opened = _FENCE.match(line)
        heading = _HEADING.match(line)
        if opened or heading or not line.strip():
            if para:
                blocks.append(("\n".join(para), 0, False))
                para = []
        if opened:
            fence, closer = [line], opened.group(1)
        elif heading:
            blocks.append((line, len(heading.group(1)), False))
        elif line.strip():
            para.append(line)
    # An unclosed fence or a trailing paragraph still belongs to the document.
    if fence:
        blocks.append(("\n".join(fence), 0, True))
    if para:
        blocks.append(("\n".join(para), 0, False))
    return blocks


def _units(block: tuple[str, int, bool], tokenizer: Tokenizer, max_tokens: int) -> list[_Unit]:
    text, heading, code = block
    tokens = count_tokens(tokenizer, text)
    if tokens <= max_tokens:
        return [_Unit(text, tokens, heading, code)]
    if code:
        return [
            _Unit(t, count_tokens(tokenizer, t), 0, True)
            for t in _split_code(text, tokenizer, max_tokens)
        ]
    return [
        _Unit(t, count_tokens(tokenizer, t))
        for t in _split_text(text, tokenizer, max_tokens, tokens=tokens)
    ]


def _split_code(text: str, tokenizer: Tokenizer, max_tokens: int) -> list[str]:
    """Split an oversized fenced block by lines, wrapping each piece in the same fences."""
    lines = text.split("\n")
    opener = lines[0]
    marker = _FENCE.match(opener)
    fence_char = marker.group(1) if marker else "```"
    indent = opener[: len(opener) - len(opener.lstrip())]
    closer = lines[-1] if len(lines) > 1 and lines[-1].strip().startswith(fence_char) else ""
    inner = "\n".join(lines[1 : len(lines) - 1 if closer else len(lines)])
    closer = closer or indent + fence_char
    budget = max(8, max_tokens - count_tokens(tokenizer, f"{opener}\n\n{closer}"))
    return [f"{opener}\n{p}\n{closer}" for p in _split_text(inner, tokenizer, budget)]


def _split_text(
    text: str, tokenizer: Tokenizer, max_tokens: int, level: int = 0, tokens: int | None = None
) -> list[str]:
    """Split at the coarsest separator that works (lines, sentences, words, then characters).

    Pieces are sized by the sum of their parts' counts, which never undercounts much: BPE
    merges across a junction only shorten the joined text.
    """
    if tokens is None:
        tokens = count_tokens(tokenizer, text)
    if tokens <= max_tokens:
        return [text]
    if level >= len(_SEPARATORS):
        mid = len(text) // 2
        if mid == 0:
            return [text]
        return _split_text(text[:mid], tokenizer, max_tokens, level) + _split_text(
            text[mid:], tokenizer, max_tokens, level
        )
    sep = _SEPARATORS[level]
    parts = text.split(sep)
    if len(parts) == 1:
        return _split_text(text, tokenizer, max_tokens, level + 1, tokens)
    parts = [p + sep for p in parts[:-1]] + [parts[-1]]
    pieces: list[str] = []
    current, size = "", 0
    for part in parts:
        n = count_tokens(tokenizer, part)
        if current and size + n > max_tokens:
            pieces.append(current)
            current, size = "", 0
        if n > max_tokens:
            pieces.extend(_split_text(part, tokenizer, max_tokens, level + 1, n))
        else:
            current, size = current + part, size + n
    if current:
        pieces.append(current)
    return [p for p in pieces if p.strip()]


def _sections(units: Sequence[_Unit]) -> list[list[_Unit]]:
    """Cut before top-level headings, except right after headings (a title joins its section)."""
    sections: list[list[_Unit]] = [[]]
    for unit in units:
        hard = unit.heading and unit.heading <= HARD_HEADING_LEVEL
        if hard and not _only_headings(sections[-1]):
            sections.append([])
        sections[-1].append(unit)
    return [s for s in sections if s]


def _only_headings(units: Sequence[_Unit]) -> bool:
    return all(u.heading for u in units)


def _pack(units: Sequence[_Unit], tokenizer: Tokenizer, max_tokens: int, overlap: int) -> list[str]:
    """Greedy packing of one section's units into chunk texts; headings stay with what follows."""
    chunks: list[list[_Unit]] = []
    current: list[_Unit] = []
    size = 0
    for unit in units:
        # A lower heading starts a new chunk once the current one is half full.
        soft_break = unit.heading and size >= max_tokens // 2
        if not _only_headings(current) and (size + unit.tokens > max_tokens or soft_break):
            carried = _carry_headings(current)
            chunks.append(current)
            current = carried or _overlap(current, tokenizer, overlap)
            size = sum(u.tokens + _JOIN_TOKENS for u in current)
            if not carried and size + unit.tokens > max_tokens:
                current, size = [], 0
        current.append(unit)
        size += unit.tokens + _JOIN_TOKENS
    if current:
        chunks.append(current)
    return ["\n\n".join(u.text for u in chunk) for chunk in chunks]


def _carry_headings(current: list[_Unit]) -> list[_Unit]:
    """Move trailing headings off a chunk that is about to close, so they lead the next one."""
    carried: list[_Unit] = []
    while len(current) > 1 and current[-1].heading:
        carried.insert(0, current.pop())
    return carried


def _overlap(previous: list[_Unit], tokenizer: Tokenizer, overlap: int) -> list[_Unit]:
    """Whole trailing lines of the previous chunk's last prose unit, within `overlap` tokens."""
    last = previous[-1]
    if overlap <= 0 or last.code or last.heading:
        return []
    kept: list[str] = []
    used = 0
    for line in reversed(last.text.split("\n")):
        tokens = count_tokens(tokenizer, line + "\n")
        if used + tokens > overlap:
            break
        kept.insert(0, line)
        used += tokens
    return [_Unit("\n".join(kept), used)] if kept else []
