"""Shared fakes of the unit tests: a stand-in tokenizer and the streams handlers' port and deps."""

from __future__ import annotations

import re
import zlib

# GPT-2 style pre-tokenization: a word keeps its leading space, whitespace runs stay apart.
_PIECES = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+")


class WordTokenizer:
    """Splits like GPT-2's pre-tokenizer and maps each piece to a stable id (no vocabulary).

    Joined strings tokenize differently from their parts (``"a\\n\\n" + "b"`` vs
    ``"a\\n\\nb"``), as with a real BPE tokenizer, which is what boundary tests need.
    """

    vocab_size = 1 << 20

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for piece in _PIECES.findall(text):
            token = zlib.crc32(piece.encode("utf-8")) % self.vocab_size
            # Two pieces may share a crc: the later one takes the next free id, so that
            # decode gives the text back (a property test found one such pair).
            while self._pieces.setdefault(token, piece) != piece:
                token = (token + 1) % self.vocab_size
            ids.append(token)
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self._pieces[i] for i in ids)
