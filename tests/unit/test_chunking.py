"""Chunking: deterministic, token-bounded, markdown-aware, stable ids and content hashes."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag.chunking import (
    chunk_document,
    chunk_id,
    content_hash,
    count_tokens,
    normalize,
    split_chunk_id,
)
from tests.unit.conftest import WordTokenizer

TOK = WordTokenizer()


def _para(word: str, n: int) -> str:
    return " ".join(f"{word}{i}" for i in range(n)) + "."


def _doc(*sections: str) -> str:
    return "\n\n".join(sections)


def test_ids_hashes_and_determinism() -> None:
    text = _doc("# Title", _para("alpha", 80), _para("beta", 80), _para("gamma", 80))
    first = chunk_document("docs/a.md", text, TOK, max_tokens=100)
    assert first == chunk_document("docs/a.md", text, TOK, max_tokens=100)
    assert [c.chunk_id for c in first] == [f"docs/a.md#{i}" for i in range(len(first))]
    for chunk in first:
        assert chunk.content_hash == hashlib.sha256(chunk.text.encode()).hexdigest()
        assert chunk.text == normalize(chunk.text)
        assert chunk.tokens == count_tokens(TOK, chunk.text)
        assert chunk.ref.chunk_id == chunk.chunk_id and chunk.ref.doc_id == "docs/a.md"


def test_normalization_ignores_line_endings_trailing_spaces_and_unicode_form() -> None:
    assert content_hash("a  \r\nb\r\n\n") == content_hash("a\nb")
    assert content_hash("caf\u00e9") == content_hash("cafe\u0301")
    assert content_hash("a\nb") != content_hash("a b")


def test_empty_document_has_no_chunks() -> None:
    assert chunk_document("a", "  \n\n ", TOK) == []


def test_overlap_must_be_below_the_budget() -> None:
    with pytest.raises(ValueError, match="overlap"):
        chunk_document("a", "x", TOK, max_tokens=32, overlap=32)


@pytest.mark.parametrize("doc_id", ["a.md", "x#y.md", "a#1"])
def test_chunk_id_round_trip(doc_id: str) -> None:
    assert split_chunk_id(chunk_id(doc_id, 12)) == (doc_id, 12)


def test_split_chunk_id_rejects_other_strings() -> None:
    with pytest.raises(ValueError, match="chunk id"):
        split_chunk_id("no-ordinal")


def test_code_block_that_fits_is_not_split() -> None:
    code = "```yaml\n" + "\n".join(f"key{i}: value{i}" for i in range(20)) + "\n```"
    text = _doc(_para("lead", 50), code, _para("tail", 10))
    chunks = chunk_document("a", text, TOK, max_tokens=128)
    holding = [c for c in chunks if "key0:" in c.text]
    assert len(holding) == 1 and code in holding[0].text


def test_oversized_code_block_is_split_into_fenced_pieces() -> None:
    code = "```bash\n" + "\n".join(f"echo line{i} more words here" for i in range(120)) + "\n```"
    chunks = chunk_document("a", code, TOK, max_tokens=64)
    assert len(chunks) > 3
    for chunk in chunks:
        lines = chunk.text.split("\n")
        assert lines[0] == "```bash" and lines[-1] == "```"
    body = [ln for c in chunks for ln in c.text.split("\n") if ln.startswith("echo")]
    assert body == [f"echo line{i} more words here" for i in range(120)]


def test_unclosed_fence_still_belongs_to_the_document() -> None:
    chunks = chunk_document("a", "intro\n\n```\ncode line", TOK, max_tokens=64)
    assert "code line" in chunks[-1].text


def test_headings_never_end_a_chunk() -> None:
    parts = []
    for i in range(12):
        parts += [f"### Heading {i}", _para(f"w{i}x", 25)]
    chunks = chunk_document("a", _doc(*parts), TOK, max_tokens=80)
    for chunk in chunks[:-1]:
        assert not chunk.text.split("\n")[-1].startswith("#")


def test_chunks_never_span_a_top_level_heading() -> None:
    text = _doc("## One", _para("a", 10), "## Two", _para("b", 10))
    chunks = chunk_document("a", text, TOK, max_tokens=200)
    assert [c.text.split("\n")[0] for c in chunks] == ["## One", "## Two"]


def test_a_title_stays_with_its_first_section() -> None:
    chunks = chunk_document("a", _doc("# Title", "## Intro", _para("a", 10)), TOK, max_tokens=200)
    assert len(chunks) == 1


def test_an_edit_leaves_the_chunks_of_other_sections_unchanged() -> None:
    sections = [_doc(f"## Section {i}", _para(f"s{i}w", 60), _para(f"s{i}v", 60)) for i in range(4)]
    before = chunk_document("a", _doc(*sections), TOK, max_tokens=64)
    sections[1] = sections[1].replace("s1w3 ", "s1w3 inserted words ")
    after = chunk_document("a", _doc(*sections), TOK, max_tokens=64)
    old, new = {c.content_hash for c in before}, {c.content_hash for c in after}
    assert 1 <= len(new - old) <= 2
    assert {c.ref for c in before if "Section 0" in c.text or "s0" in c.text} <= {
        c.ref for c in after
    }


def test_overlap_repeats_trailing_lines() -> None:
    lines = [f"line {i} says something short" for i in range(40)]
    chunks = chunk_document("a", "\n".join(lines), TOK, max_tokens=60, overlap=16)
    assert len(chunks) > 2
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt.text.split("\n")[0] in prev.text.split("\n")
    no_overlap = chunk_document("a", "\n".join(lines), TOK, max_tokens=60)
    assert sum(c.tokens for c in chunks) > sum(c.tokens for c in no_overlap)


def test_very_long_line_and_word_are_split() -> None:
    text = _para("word", 500) + "\n\n" + "x" * 5000
    chunks = chunk_document("a", text, TOK, max_tokens=50)
    assert all(c.tokens <= 54 for c in chunks)
    assert "".join(c.text for c in chunks).count("x") == 5000


_words = st.text(alphabet="abcdefgh", min_size=1, max_size=8)
_line = st.lists(_words, min_size=1, max_size=12).map(" ".join)
_para_st = st.lists(_line, min_size=1, max_size=4).map("\n".join)
_heading = st.tuples(st.integers(1, 4), _line).map(lambda t: "#" * t[0] + " " + t[1])
_code = st.lists(_line, min_size=1, max_size=5).map(lambda ls: "```\n" + "\n".join(ls) + "\n```")
_docs = st.lists(st.one_of(_para_st, _heading, _code), min_size=1, max_size=25).map("\n\n".join)


@settings(max_examples=80, deadline=None)
@given(text=_docs, max_tokens=st.integers(48, 160))
def test_chunks_cover_every_line_in_order_within_the_budget(text: str, max_tokens: int) -> None:
    chunks = chunk_document("d", text, TOK, max_tokens=max_tokens)
    # Oversized code blocks are re-fenced piece by piece: compare without fence lines.
    lines = [ln for c in chunks for ln in c.text.split("\n") if _content(ln)]
    assert lines == [ln for ln in normalize(text).split("\n") if _content(ln)]
    # Headings may ride along with the unit they introduce; nothing else exceeds the budget.
    slack = max((count_tokens(TOK, ln) for ln in lines if ln.startswith("#")), default=0) * 4
    assert all(c.tokens <= max_tokens + slack + 2 for c in chunks)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))


def _content(line: str) -> bool:
    return bool(line.strip()) and line.strip() != "```"


class CountingTokenizer(WordTokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[str] = []

    def encode(self, text, add_special_tokens=False):
        self.encoded.append(text)
        return super().encode(text, add_special_tokens=add_special_tokens)


def test_token_counts_are_remembered_per_tokenizer():
    tok, other = CountingTokenizer(), CountingTokenizer()
    assert count_tokens(tok, "one two three") == count_tokens(tok, "one two three") == 3
    assert tok.encoded == ["one two three"]
    assert count_tokens(other, "one two three") == 3
    assert other.encoded == ["one two three"]  # its own counts, not the first one's


def test_rechunking_an_edited_document_encodes_only_what_changed():
    tok = CountingTokenizer()
    before = _doc("# Title", _para("alpha", 40), _para("beta", 40), _para("gamma", 40))
    after = before.replace("beta3 ", "BETA3 ")
    first = chunk_document("d.md", before, tok, max_tokens=64)
    assert chunk_document("d.md", before, tok, max_tokens=64) == first  # same, from memory
    encoded = len(tok.encoded)
    edited = chunk_document("d.md", after, tok, max_tokens=64)
    assert edited == chunk_document("d.md", after, CountingTokenizer(), max_tokens=64)
    assert 0 < len(tok.encoded) - encoded < encoded / 2
