"""`Retriever` keeps question vectors: a question asked again is not embedded again."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from rag import retrieve
from rag.retrieve import Retriever


class CountingEmbedder:
    """Deterministic vectors from the text; records what it was asked to embed."""

    dim = 4

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([[len(t), ord(t[0]), 1.0, 0.0] for t in texts], dtype=np.float32)


class EchoStore:
    """Returns no hits but records the vectors searched with."""

    def __init__(self) -> None:
        self.searched: list[np.ndarray] = []

    def may_hold(self, tenant: str | None) -> bool:
        return True

    def search(self, vector: np.ndarray, limit: int, tenant: str | None) -> list:
        self.searched.append(vector)
        return []


def retriever() -> tuple[Retriever, CountingEmbedder, EchoStore]:
    embedder, store = CountingEmbedder(), EchoStore()
    return Retriever(store, embedder), embedder, store  # type: ignore[arg-type]


def test_a_question_is_embedded_once_however_often_it_is_retrieved():
    r, embedder, store = retriever()
    r.retrieve_many(["alpha", "beta", "alpha"])
    r.retrieve_many(["alpha", "gamma"])
    r.retrieve("beta")
    assert embedder.calls == [["alpha", "beta"], ["gamma"]]
    assert r.reused == 3  # the batch's second alpha, then alpha, then beta
    # Every search used the vector the embedder gave for its own question.
    expected = [embedder.embed([q])[0] for q in ["alpha", "beta", "alpha", "alpha", "gamma",
                                                 "beta"]]
    assert all(np.array_equal(a, b) for a, b in zip(store.searched, expected, strict=True))
    assert not store.searched[0].flags.writeable  # a kept vector cannot be changed in place


def test_the_least_recently_retrieved_question_is_dropped_first(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(retrieve, "QUESTION_VECTORS", 2)
    r, embedder, _ = retriever()
    r.retrieve("alpha")
    r.retrieve("beta")
    r.retrieve("alpha")  # alpha is now the most recent
    r.retrieve("gamma")  # beta goes
    r.retrieve("alpha")
    r.retrieve("beta")
    assert embedder.calls == [["alpha"], ["beta"], ["gamma"], ["beta"]]
