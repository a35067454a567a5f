"""The canonical prompt: one prefix per chunk set, an exact prefix/question boundary."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag.prompt import (
    Layout,
    PromptBuilder,
    build_prefix,
    build_prompt,
    canonical_order,
    chat_layout,
)
from tests.unit.conftest import WordTokenizer


@dataclass(frozen=True)
class FakeChunk:
    chunk_id: str
    text: str

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


class ChatTokenizer(WordTokenizer):
    """A tokenizer with a ChatML-like template, rendered the way transformers does."""

    chat_template = "chatml"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ShuffledTemplate(WordTokenizer):
    """A template that repeats the system text: our parts cannot be placed in it."""

    chat_template = "odd"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return "".join(m["content"] * 2 for m in messages)


CHUNKS = [
    FakeChunk("docs/b.md#2", "Beta two. Sync waves order resources."),
    FakeChunk("docs/a.md#10", "Alpha ten. Projects restrict destinations."),
    FakeChunk("docs/a.md#9", "Alpha nine.\n```yaml\nkind: Application\n```"),
]


@pytest.mark.parametrize("tokenizer", [WordTokenizer(), ChatTokenizer()])
def test_any_score_order_gives_the_same_prefix(tokenizer: WordTokenizer) -> None:
    import itertools

    prefixes = {
        tuple(build_prompt(list(p), "Why?", tokenizer).prefix_ids)
        for p in itertools.permutations(CHUNKS)
    }
    assert len(prefixes) == 1


def test_canonical_order_is_by_document_then_ordinal() -> None:
    ordered = [c.chunk_id for c in canonical_order(CHUNKS)]
    assert ordered == ["docs/a.md#9", "docs/a.md#10", "docs/b.md#2"]


def test_duplicates_are_dropped() -> None:
    tok = WordTokenizer()
    assert build_prefix(CHUNKS + CHUNKS[:1], tok) == build_prefix(CHUNKS, tok)


def test_prefix_matches_build_prefix_and_the_boundary_is_exact() -> None:
    tok = ChatTokenizer()
    builder = PromptBuilder(tok, system_prompt="Be brief.")
    prompt = builder.build(CHUNKS, "  How do sync waves work?  ")
    assert list(prompt.prefix_ids) == builder.build_prefix(CHUNKS)
    assert list(prompt.question_ids) == tok.encode("How do sync waves work?" + builder.layout.tail)
    # What the streams app appends to a warm prefix for a question it knows.
    assert builder.question_ids("  How do sync waves work?  ") == list(prompt.question_ids)
    assert prompt.text == prompt.prefix_text + "How do sync waves work?" + builder.layout.tail
    assert tok.decode(list(prompt.token_ids)) == prompt.text
    assert [r.chunk_id for r in prompt.chunk_refs] == ["docs/a.md#9", "docs/a.md#10", "docs/b.md#2"]


def test_separate_encoding_differs_from_re_tokenizing_the_joined_text() -> None:
    # Why parts are encoded one by one: the joined string merges tokens across the seam.
    tok = WordTokenizer()
    prompt = build_prompt(CHUNKS, "Why?", tok)
    assert tok.encode(prompt.text) != list(prompt.token_ids)


def test_chat_template_places_context_in_system_and_question_in_user() -> None:
    layout = chat_layout(ChatTokenizer())
    assert layout == Layout(
        head="<|im_start|>system\n",
        between="<|im_end|>\n<|im_start|>user\n",
        tail="<|im_end|>\n<|im_start|>assistant\n",
    )
    prompt = build_prompt(CHUNKS, "Why?", ChatTokenizer(), system_prompt="SYS")
    assert prompt.prefix_text.startswith("<|im_start|>system\nSYS")
    assert prompt.prefix_text.endswith("<|im_start|>user\n")


def test_tokenizers_without_a_usable_template_get_the_plain_layout() -> None:
    assert chat_layout(WordTokenizer()) == Layout.plain()
    assert chat_layout(ShuffledTemplate()) == Layout.plain()


def test_different_chunk_sets_or_system_prompts_give_different_prefixes() -> None:
    tok = WordTokenizer()
    assert build_prefix(CHUNKS[:2], tok) != build_prefix(CHUNKS, tok)
    assert build_prefix(CHUNKS, tok, "A.") != build_prefix(CHUNKS, tok, "B.")


def test_a_changed_chunk_text_changes_the_prefix_and_its_ref() -> None:
    tok = WordTokenizer()
    edited = [FakeChunk(CHUNKS[0].chunk_id, CHUNKS[0].text + " More."), *CHUNKS[1:]]
    a, b = build_prompt(CHUNKS, "Q", tok), build_prompt(edited, "Q", tok)
    assert a.prefix_ids != b.prefix_ids
    assert a.chunk_refs != b.chunk_refs


_chunk = st.builds(
    FakeChunk,
    chunk_id=st.tuples(st.sampled_from(["a.md", "b.md", "c#d.md"]), st.integers(0, 30)).map(
        lambda t: f"{t[0]}#{t[1]}"
    ),
    text=st.text(alphabet="abc \n.#`", min_size=1, max_size=40),
)


@given(
    chunks=st.lists(_chunk, min_size=1, max_size=5),
    seed=st.randoms(),
    question=st.text(min_size=1, max_size=30),
)
def test_prefix_is_a_function_of_the_chunk_set(chunks, seed, question) -> None:
    tok = ChatTokenizer()
    shuffled = list(chunks)
    seed.shuffle(shuffled)
    a, b = build_prompt(chunks, question, tok), build_prompt(shuffled, "other", tok)
    assert a.prefix_ids == b.prefix_ids
    assert a.token_ids[: a.prefix_len] == tuple(build_prefix(shuffled, tok))
    assert tok.decode(list(a.token_ids)) == a.text
