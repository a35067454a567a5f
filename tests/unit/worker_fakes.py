"""A worker in-process over a tiny deterministic stand-in engine, for the tests of its HTTP
layer and runtime (`test_service_http` and the tests beside it): 4-token blocks, one fixed
output token, a sink that keeps the events, a boot that waits for a gate."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence

from aiohttp.test_utils import TestClient, TestServer

from schemas import WorkerEvent
from workers.api import Limits
from workers.engines.base import Request, ServerKVEngine, keep_by_prefill
from workers.engines.protocol import GenerationResult, GenerationStep
from workers.kv.cache import PrefixCache
from workers.kv.memory import Budget
from workers.metrics import WorkerMetrics
from workers.runtime import WorkerRuntime
from workers.service import ServiceConfig, ServiceState, build_app

BLOCK = 4
KV_PER_TOKEN = 10


class ToyEngine(ServerKVEngine):
    """The shared engine bookkeeping over a PrefixCache; 'generates' token 7 ('x')."""

    model_id = "toy"
    device = "cpu"
    block_size = BLOCK
    max_model_len = 64
    vocab_size = 500
    kv_bytes_per_token = KV_PER_TOKEN

    def __init__(self) -> None:
        self.cache = PrefixCache(Budget(100_000, 100, 50_000), block_size=BLOCK)
        self._held: dict[str, int] = {}

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % 500 for c in text]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def _warm(self, tokens: list[int], tenant: str) -> int:
        return 0  # no server cache to hit: a warmup computes every token

    def _generate(self, request: Request) -> Iterator[GenerationStep]:
        self.last_request = request
        prompt, n, tenant, keep = request.prompt, request.max_tokens, request.tenant, request.keep
        entry, matched = self._lookup(self.block_hashes(prompt, tenant=tenant))
        cached = min(matched * BLOCK, len(prompt) - 1) if entry is not None else 0
        hit = entry.prefix_hash if entry else None
        result = GenerationResult(
            (7,) * n, "x" * n, len(prompt), cached, hit, 0.001, 0.002, "length"
        )
        for i in range(n):
            step = GenerationStep(i, 7, "x", result if i == n - 1 else None)
            yield step if keep is None else keep_by_prefill(self, step, prompt, tenant, keep)


class ListSink:
    def __init__(self) -> None:
        self.events: list[WorkerEvent] = []
        self.closed = False

    def send(self, event: WorkerEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        self.closed = True

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


class GatedLifecycle:
    """Boot blocks until `gate` is set, like a model that takes a while to load."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sink = ListSink()
        self.metrics = WorkerMetrics(worker_id="w1", model_name="toy")
        self.stopped = False

    def start(self, report: Callable[[str], None]) -> WorkerRuntime:
        report("loading model")
        self.gate.wait(30)
        return WorkerRuntime(
            ToyEngine(),
            worker_id="w1",
            url="http://toy",
            sink=self.sink,
            metrics=self.metrics,
            limits=Limits(max_prompt_tokens=40, max_tokens=8, context_tokens=64, vocab_size=500),
            node="node-1",
        )

    def stop(self) -> None:
        self.stopped = True


async def serve(lifecycle: GatedLifecycle, api_key: str | None = None) -> TestClient:
    config = ServiceConfig(worker_id="w1", api_key=api_key, heartbeat_s=0.05)
    state = ServiceState(config=config, metrics=lifecycle.metrics, lifecycle=lifecycle)
    client = TestClient(TestServer(build_app(state)))
    await client.start_server()
    return client


async def wait_ready(client: TestClient) -> None:
    for _ in range(200):
        if (await client.get("/health/ready")).status == 200:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never ready")


async def entries_reach(client: TestClient, n: int) -> dict:
    for _ in range(500):
        cache = await (await client.get("/v1/cache")).json()
        if cache["entries"] >= n:
            return cache
        await asyncio.sleep(0.01)
    raise AssertionError(f"the cache never held {n} entries")


async def complete(client: TestClient, prompt: list[int], **kw) -> dict:
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, **kw}
    response = await client.post("/v1/completions", json=body)
    assert response.status == 200, await response.text()
    return await response.json()


def runtime_and_sink():
    """A started worker runtime over the toy engine, and the sink keeping its events."""
    lifecycle = GatedLifecycle()
    lifecycle.gate.set()
    return lifecycle.start(lambda _m: None), lifecycle.sink
