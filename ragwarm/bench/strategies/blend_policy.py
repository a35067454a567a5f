"""`hybrid-blend`: hybrid, plus chunk-level KV reuse fed by KB events (issue 18)."""

from __future__ import annotations

from typing import ClassVar

from ragwarm.bench.strategies.streams_sim import Hybrid


class HybridBlend(Hybrid):
    """`hybrid-blend`: `hybrid` on a worker that blends held chunk KV into prompts no cached
    prefix covers (RAGWARM_WORKER_CHUNK_REUSE, at the worker's default recompute share and
    selection), with the streams app's event-driven chunk warmup: a KB change prefills the
    new chunks of hot or tracked documents, and the ready worker gets the hot set's chunks.
    Exact prefix reuse still comes first; blending only serves what it leaves cold."""

    name: ClassVar[str] = "hybrid-blend"
    chunk_reuse: ClassVar[bool] = True
    chunk_warmup: ClassVar[bool] = True
