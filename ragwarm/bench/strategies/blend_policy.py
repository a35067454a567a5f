"""`hybrid-chunks` and `hybrid-blend`: hybrid plus chunk KV warmed by the streams app (issue 18):
exact reuse of a warm first chunk, and with blending, of chunks further in."""

from __future__ import annotations

from typing import ClassVar

from ragwarm.bench.strategies.streams_policy import Hybrid


class HybridChunks(Hybrid):
    """`hybrid-chunks`: `hybrid` with the streams app's chunk warmup (RAGWARM_STREAMS_CHUNK_WARMUP)
    and no blending: the worker holds `system + chunk` for the chunks questions retrieve
    most, so a question never asked before whose first chunk is warm reuses it exactly (no
    quality loss)."""

    name: ClassVar[str] = "hybrid-chunks"
    chunk_warmup: ClassVar[bool] = True


class HybridBlend(Hybrid):
    """`hybrid-blend`: `hybrid` on a worker that blends held chunk KV into prompts no cached
    prefix covers (RAGWARM_WORKER_CHUNK_REUSE, at the worker's default recompute share and
    selection), with the streams app's event-driven chunk warmup: a KB change prefills the
    new chunks of hot or tracked documents, and the ready worker gets the hot set's chunks.
    Exact prefix reuse still comes first; blending only serves what it leaves cold."""

    name: ClassVar[str] = "hybrid-blend"
    chunk_reuse: ClassVar[bool] = True
    chunk_warmup: ClassVar[bool] = True
