"""AheadVectors: each fresh hash looked up or embedded once, in calls of `batch_size`, rows
saved for reuse, and no embed call left running after `close()`."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rag.embed_ahead import AheadVectors


class DictStore:
    """The two vector calls of ChunkStore, over a dict."""

    def __init__(self, stored: dict[str, np.ndarray] | None = None) -> None:
        self.stored = dict(stored or {})
        self.saves: list[list[str]] = []

    def vectors_by_hash(self, hashes):
        return {h: self.stored[h] for h in hashes if h in self.stored}

    def save_vectors(self, vectors):
        self.saves.append(sorted(vectors))
        self.stored.update(vectors)


class CountingEmbedder:
    dim = 2

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = gate

    def embed(self, texts, progress=None):
        if self.gate is not None:
            self.gate.wait(5)
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        return np.array([[float(len(t)), float(ord(t[0]))] for t in texts], dtype=np.float32)


def _texts(*hashes: str) -> dict[str, str]:
    return {h: f"text of {h}" for h in hashes}


@pytest.mark.parametrize("background", [True, False])
def test_each_hash_embedded_once_and_rows_match_their_texts(background):
    store = DictStore({"s": np.array([9.0, 9.0], dtype=np.float32)})
    embedder = CountingEmbedder()
    pool = ThreadPoolExecutor(1, thread_name_prefix="embed-test") if background else None
    ahead = AheadVectors(store, embedder, pool, batch_size=2)
    try:
        assert ahead.request(["a", "b", "s"], _texts("a", "b", "s")) == 2  # s is stored
        assert ahead.request(["b", "c"], _texts("b", "c")) == 1  # b already asked for
        ahead.flush()
        got = ahead.vectors(["c", "a", "s", "b"])
    finally:
        ahead.close()
    assert sorted(t for call in embedder.calls for t in call) == [
        "text of a", "text of b", "text of c"
    ]
    assert [len(call) for call in embedder.calls] == [2, 1]
    for h in "abc":
        text = f"text of {h}"
        assert got[h].tolist() == [float(len(text)), float(ord(text[0]))]
    assert got["s"].tolist() == [9.0, 9.0]
    assert sorted(h for save in store.saves for h in save) == ["a", "b", "c"]
    if background:
        assert all(name.startswith("embed-test") for name in embedder.threads)


def test_a_queued_hash_is_flushed_when_read():
    embedder = CountingEmbedder()
    ahead = AheadVectors(DictStore(), embedder, ThreadPoolExecutor(1), batch_size=10)
    ahead.request(["x"], _texts("x"))
    assert embedder.calls == []  # below batch_size: still queued
    assert ahead.vectors(["x"])["x"].shape == (2,)
    ahead.close()
    assert embedder.calls == [["text of x"]]


def test_close_waits_for_embedding_started_even_when_the_batch_fails():
    gate = threading.Event()
    embedder = CountingEmbedder(gate)
    ahead = AheadVectors(DictStore(), embedder, ThreadPoolExecutor(1), batch_size=1)
    ahead.request(["x"], _texts("x"))  # a call is running, held at the gate
    threading.Timer(0.2, gate.set).start()
    ahead.close()
    assert embedder.calls == [["text of x"]]


def test_rows_read_twice_are_saved_once():
    store = DictStore()
    ahead = AheadVectors(store, CountingEmbedder(), None, batch_size=1)
    ahead.request(["a"], _texts("a"))
    ahead.vectors(["a"])
    ahead.vectors(["a"])
    assert store.saves == [["a"]]
