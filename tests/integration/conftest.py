"""Fixtures of the integration tier: the real models, loaded once per session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rag.embed import Embedder


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
