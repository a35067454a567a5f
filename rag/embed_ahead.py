"""A batch's new chunk vectors, embedded in a thread of their own while the batch's other
documents are chunked and written.

Indexing one batch used to run chunk, store lookups, embed and store writes one after the
other in one thread; the embedder (one torch thread by default) sat idle during the rest,
about a third of the KB phase on a 2-core machine (issue 14's `kb_chunks_per_s` against
`embed_chunks_per_s`). Here the texts are queued as each document is planned, handed to the
embedding thread `batch_size` at a time, and each document waits only for its own rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future, wait

import numpy as np

from rag.embed import TextEmbedder
from rag.store import ChunkStore


class AheadVectors:
    """The vectors of one batch's fresh content hashes, each looked up or embedded once.

    Not thread-safe: one indexing thread calls `request`, `flush`, `vectors` and `close`;
    only `embedder.embed` runs in `pool`. `close()` waits for every embed call it started,
    so nothing uses the embedder after the batch (retrieval shares it, and a fast tokenizer
    used from two threads at once fails).
    """

    def __init__(
        self, store: ChunkStore, embedder: TextEmbedder, pool: Executor | None, batch_size: int
    ) -> None:
        self.store, self.embedder, self.pool = store, embedder, pool
        self.batch_size = max(1, batch_size)
        self.known: dict[str, np.ndarray] = {}
        self.slots: dict[str, tuple[int, int]] = {}  # hash -> (embed call, row)
        self.calls: list[Future[np.ndarray]] = []
        self.saved: set[int] = set()  # embed calls whose rows are in the store
        self.queued: list[tuple[str, str]] = []  # (hash, text) of the next call

    def request(self, hashes: Iterable[str], texts: dict[str, str]) -> int:
        """Ask for these hashes' vectors; returns how many this request will embed (the
        rest are in the store or already asked for)."""
        needed = set(hashes) - self.known.keys() - self.slots.keys()
        if not needed:
            return 0
        self.known.update(self.store.vectors_by_hash(needed))
        missing = sorted(needed - self.known.keys())
        for h in missing:
            self.slots[h] = (len(self.calls), len(self.queued))
            self.queued.append((h, texts[h]))
        if len(self.queued) >= self.batch_size:
            self.flush()
        return len(missing)

    def flush(self) -> None:
        """Start embedding what is queued."""
        if not self.queued:
            return
        texts = [t for _, t in self.queued]
        self.queued = []
        if self.pool is None:  # inline: the old sequential path
            future: Future[np.ndarray] = Future()
            future.set_result(self.embedder.embed(texts))
        else:
            future = self.pool.submit(self.embedder.embed, texts)
        self.calls.append(future)

    def vectors(self, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """These hashes' vectors (all asked for before), waiting for the embedder if needed;
        a finished embed call's rows are saved for reuse the first time they are read."""
        out: dict[str, np.ndarray] = {}
        for h in hashes:
            if h in self.known:
                out[h] = self.known[h]
                continue
            call, row = self.slots[h]
            if call == len(self.calls):  # still queued: asked for after the last flush
                self.flush()
            rows = self.calls[call].result()
            if call not in self.saved:
                self.saved.add(call)
                self._save(call, rows)
            out[h] = rows[row]
        return out

    def close(self) -> None:
        """Wait for every embed call started (whatever happened to the batch)."""
        wait(self.calls)

    def _save(self, call: int, rows: np.ndarray) -> None:
        hashes = sorted((row, h) for h, (c, row) in self.slots.items() if c == call)
        computed = {h: rows[row] for row, h in hashes}
        self.store.save_vectors(computed)
        self.known.update(computed)
