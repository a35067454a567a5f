"""`hybrid-chunks` and `hybrid-blend`: hybrid plus chunk KV warmed by the streams app (issue 18):
exact reuse of a warm first chunk, and with blending, of chunks further in. (`hybrid` itself
blends the chunks its stored prompts donate; these add the app's chunk warmup.)"""

from __future__ import annotations

from typing import ClassVar

from ragwarm.bench.strategies.streams_policy import Hybrid


class HybridChunks(Hybrid):
    """`hybrid-chunks`: `hybrid-noblend` with the streams app's chunk warmup
    (RAGWARM_STREAMS_CHUNK_WARMUP): the worker holds `system + chunk` for the chunks questions
    retrieve most, so a question never asked before whose first chunk is warm reuses it
    exactly (no quality loss)."""

    name: ClassVar[str] = "hybrid-chunks"
    chunk_warmup: ClassVar[bool] = True
    chunk_reuse: ClassVar[bool] = False


class HybridBlend(Hybrid):
    """`hybrid-blend`: `hybrid` with blending on whatever `hybrid_blends` says, plus the
    streams app's event-driven chunk warmup: a KB change prefills the new chunks of hot or
    tracked documents, and the ready worker gets the hot set's chunks (donated like any
    stored prompt's). Exact prefix reuse still comes first; blending only serves what it
    leaves cold."""

    name: ClassVar[str] = "hybrid-blend"
    chunk_reuse: ClassVar[bool] = True
    chunk_warmup: ClassVar[bool] = True
