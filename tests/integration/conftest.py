"""Fixtures of the integration tier: the real models, loaded once per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rag.embed import Embedder
    from workers.engines.torch_engine import TorchEngine


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """SmolLM2's tokenizer (fetched first if missing; at once when the copy is there)."""
    from ragwarm.models import fetch_llm, load_tokenizer

    return load_tokenizer(fetch_llm())


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real sentence embedder, offline."""
    from ragwarm.models import load_embedder

    return load_embedder()


@pytest.fixture(scope="session")
def model_path() -> Path:
    """SmolLM2's folder (fetched first if missing; at once when the copy is there)."""
    from ragwarm.models import fetch_llm

    return fetch_llm()


@pytest.fixture(scope="session")
def load_engine(model_path: Path) -> Callable[..., TorchEngine]:
    """Loads the real model into a torch engine on the CPU with one thread (the CPU is
    shared with the rest of the suite); keywords override the worker settings."""
    from workers.engines.torch_engine import load_torch_engine
    from workers.settings import WorkerSettings

    def load(cache: Any = None, **settings: Any) -> TorchEngine:
        worker = WorkerSettings(**{"device": "cpu", "threads": 1, **settings})
        return load_torch_engine(model_path, worker, cache=cache)

    return load


@pytest.fixture(scope="module")
def shared_engine(load_engine: Callable[..., TorchEngine]) -> TorchEngine:
    """One engine with the default settings per test module (loading takes seconds)."""
    return load_engine()


@pytest.fixture
def engine(shared_engine: TorchEngine) -> Iterator[TorchEngine]:
    """The module's engine with nothing cached, emptied again after the test."""
    shared_engine.reset()
    yield shared_engine
    shared_engine.reset()
