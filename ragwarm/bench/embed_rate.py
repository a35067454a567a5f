"""The embedder alone on the chunks a KB history makes it embed: the ceiling of indexing."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable

from schemas import KbChange


def embedded_chunks(changes: Iterable[KbChange]) -> list[str]:
    """The texts an empty index embeds for `changes`, in order: each new content hash once
    (the indexer reuses the vector of a hash it has seen, whatever the document)."""
    from rag.chunking import chunk_document
    from rag.settings import RagSettings
    from ragwarm.models import llm_dir, load_tokenizer

    rag = RagSettings()
    tokenizer = load_tokenizer(llm_dir())
    seen: set[str] = set()
    texts: list[str] = []
    for change in changes:
        if change.op != "upsert":
            continue
        for chunk in chunk_document(
            change.doc_id, change.text or "", tokenizer, rag.chunk_tokens, rag.chunk_overlap
        ):
            if chunk.content_hash not in seen:
                seen.add(chunk.content_hash)
                texts.append(chunk.text)
    return texts


def embed_rates(texts: list[str], sample: int, seed: int = 1, passes: int = 3) -> list[float]:
    """Chunks per second of the app's embedder (same settings) on a sample of `texts`, one
    figure per timed pass: the caller takes a median (one pass on the shared VM read
    anywhere from 36 to 49 chunks/s for the same sample, and the pipeline's target is a
    fraction of it)."""
    from rag.settings import RagSettings
    from ragwarm.models import load_embedder
    from ragwarm.settings import ModelSettings

    rag = RagSettings()
    embedder = load_embedder(
        ModelSettings(), rag.embed_batch_size, rag.embed_precision, rag.embed_threads
    )
    picked = random.Random(seed).sample(texts, min(sample, len(texts)))
    embedder.embed(picked[: rag.embed_batch_size])  # first call pays the lazy set-up
    rates = []
    for _ in range(max(1, passes)):
        start = time.perf_counter()
        embedder.embed(picked)
        rates.append(len(picked) / (time.perf_counter() - start))
    return rates
