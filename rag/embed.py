"""Sentence embeddings of chunk texts and questions, loaded offline, batched, counted."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

# Runs at least this long get a progress bar (on a terminal only).
PROGRESS_MIN_TEXTS = 256

Precision = Literal["auto", "float32", "bfloat16"]


def resolve_precision(precision: Precision) -> str:
    """`auto` picks bfloat16 where the CPU has native bf16 math (about 1.6x faster on 2
    cores, cosine to the float32 vectors > 0.9999), float32 elsewhere."""
    if precision != "auto":
        return precision
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return "bfloat16" if probe is not None and probe() else "float32"


class TextEmbedder(Protocol):
    """What indexing uses of an embedder: `Embedder`, or a wrapper that times it."""

    dim: int

    def embed(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray: ...


class Embedder:
    """all-MiniLM-L6-v2 (or any sentence-transformers model) on CPU; vectors are unit length.

    `computed` counts every text embedded so far, so callers can report reuse. `threads`
    is the torch thread count while embedding (0: torch's default). One thread is the
    default: on a busy 2-core host two threads spin on each other, and one was 1.8x faster
    on batches and 10x on single questions.
    """

    def __init__(
        self, model: Any, batch_size: int = 32, precision: Precision = "auto", threads: int = 1
    ) -> None:
        self._model = model
        self.batch_size = batch_size
        self.precision = resolve_precision(precision)
        self.threads = threads
        self.dim = int(model.get_embedding_dimension())
        self.computed = 0

    @classmethod
    def load(
        cls,
        model_dir: Path,
        batch_size: int = 32,
        precision: Precision = "auto",
        threads: int = 1,
    ) -> Embedder:
        """Load a sentence-transformers directory on CPU (the caller forbids hub downloads)."""
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(model_dir), device="cpu")
        return cls(model, batch_size, precision, threads)

    def embed(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        """One float32 row per text, in order; `progress=None` shows a bar on long runs."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if progress is None:
            progress = len(texts) >= PROGRESS_MIN_TEXTS and sys.stderr.isatty()
        with self._threads(), self._autocast():
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                show_progress_bar=progress,
                convert_to_numpy=True,
                normalize_embeddings=True,
            )
        self.computed += len(texts)
        return np.asarray(vectors, dtype=np.float32)

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        if self.precision != "bfloat16":
            yield
            return
        import torch

        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        if self.threads <= 0:
            yield
            return
        import torch

        # Scoped, so a model sharing the process keeps its own setting.
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)
