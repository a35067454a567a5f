"""One block pool on the real model: request blocks and warm blocks shared, reused by prefix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from schemas import ChunkRef, WarmupCommand, WorkerEvent
from workers.api import Limits
from workers.engines.protocol import GenerateRequest, GenerationResult, GenerationStep
from workers.engines.torch_engine import TorchEngine
from workers.metrics import WorkerMetrics
from workers.runtime import WorkerRuntime

pytestmark = pytest.mark.integration

SYSTEM = "You answer questions about the mill from the context below, and nothing else.\n"
# Chunks differ from their first token on, so prompts share exactly the blocks before them.
CHUNKS = [
    f"{name} mill: the river turns its wheel in the season of {season}.\n"
    for name, season in (
        ("Alder", "spring rain"),
        ("Birch", "summer drought"),
        ("Cedar", "autumn flood"),
        ("Damson", "winter ice"),
    )
]


class Sink:
    def __init__(self) -> None:
        self.events: list[WorkerEvent] = []

    def send(self, event: WorkerEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        return None


@pytest.fixture
def runtime(engine: TorchEngine) -> Iterator[WorkerRuntime]:
    # `engine` (tests/integration/conftest.py) starts and ends empty.
    yield WorkerRuntime(
        engine,
        worker_id="w-blocks",
        url="inproc://w-blocks",
        sink=Sink(),
        metrics=WorkerMetrics(worker_id="w-blocks", model_name=engine.model_id),
        limits=Limits(4096, 8, 8192, engine.vocab_size),
        cache_requests=True,
    )


def ids(engine: TorchEngine, *parts: str) -> list[int]:
    return [t for part in parts for t in engine.tokenize(part)]


def ask(runtime: WorkerRuntime, prompt: list[int]) -> GenerationResult:
    def emit(step: GenerationStep) -> bool:
        return True

    result = runtime.generate(
        prompt, tenant="t", max_tokens=4, temperature=0.0, arrived=0.0, emit=emit
    )
    assert result is not None
    return result


def common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


def cold(engine: TorchEngine, prompt: list[int]) -> tuple[int, ...]:
    steps = list(engine.generate(GenerateRequest(prompt, max_tokens=4, tenant="cold")))
    result = steps[-1].result
    assert result is not None and result.cached_tokens == 0
    return result.token_ids


def test_a_third_prompt_reuses_the_blocks_a_request_and_a_warm_prefix_share(
    engine: TorchEngine, runtime: WorkerRuntime
) -> None:
    shared = ids(engine, SYSTEM, CHUNKS[0])
    p = shared + ids(engine, CHUNKS[1], "\nQuestion: When is mill 1 dry?\nAnswer:")
    q = shared + ids(engine, CHUNKS[2])
    r = shared + ids(engine, CHUNKS[3], "\nQuestion: What stops mill 3?\nAnswer:")
    head = len(shared) // engine.block_size  # blocks of system prompt + first chunk
    # R shares no full block with P or Q beyond the system prompt and the first chunk.
    assert head >= 2 and max(common(r, p), common(r, q)) < (head + 1) * engine.block_size

    served = ask(runtime, p)  # request caching stores P's blocks
    assert served.cached_tokens == 0 and served.stored is not None
    warm = WarmupCommand(
        command_id="warm-q",
        op="prefill",
        tenant="t",
        token_ids=q,
        chunk_refs=[ChunkRef(chunk_id="mill#2", content_hash="ab" * 8)],
        pin=True,
        ttl_s=600,
    )
    assert runtime.apply(warm) == "stored"
    result = ask(runtime, r)

    assert result.cached_tokens == head * engine.block_size
    assert result.token_ids == cold(engine, r)
    blocks = runtime.snapshot.blocks
    # P's request blocks and Q's warm blocks share the head, counted once.
    assert blocks["shared_blocks"] >= head and blocks["managed_blocks"] == len(q) // 16
    assert blocks["bytes"] == engine.memory().used == blocks["blocks"] * engine.block_bytes
    assert blocks["request_blocks"] == blocks["blocks"] - blocks["managed_blocks"] > 0


def test_invalidating_the_warm_prefix_chunk_keeps_the_shared_head(
    engine: TorchEngine, runtime: WorkerRuntime
) -> None:
    shared = ids(engine, SYSTEM, CHUNKS[0])
    p = shared + ids(engine, CHUNKS[1], "\nQuestion: When is mill 1 dry?\nAnswer:")
    q = shared + ids(engine, CHUNKS[2])
    ref = ChunkRef(chunk_id="mill#2", content_hash="cd" * 8)
    ask(runtime, p)
    warm = WarmupCommand(
        command_id="warm", op="prefill", tenant="t", token_ids=q, chunk_refs=[ref], pin=True
    )
    runtime.apply(warm)
    drop = WarmupCommand(command_id="drop", op="invalidate", tenant="t", chunk_refs=[ref])
    assert runtime.apply(drop) == "invalidated"

    head = len(shared) // engine.block_size
    # Q's own blocks are gone; the head P and Q shared still serves.
    assert engine.cache.pinned_bytes == 0
    result = ask(runtime, shared + ids(engine, CHUNKS[3]))
    assert result.cached_tokens == head * engine.block_size
