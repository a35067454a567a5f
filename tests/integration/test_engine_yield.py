"""A warmup prefill lets a waiting request go between its forward passes (real model,
torch engine, a worker runtime in-process; `workers.engine_lock`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from workers.api import Limits
from workers.commands import NullSink
from workers.engines.torch_engine import TorchEngine
from workers.metrics import WorkerMetrics
from workers.runtime import WorkerRuntime

pytestmark = pytest.mark.integration

PASS = 32  # tokens a forward pass: a 300-token warmup runs in ~10 passes
TEXT = ("The mill by the river grinds wheat in spring and barley in autumn; its wheel turns "
        "as long as the water runs, and the miller keeps a ledger of every sack. ") * 12


@pytest.fixture(scope="module")
def engine(load_engine: Callable[..., TorchEngine]) -> TorchEngine:
    return load_engine(prefill_chunk_tokens=PASS)


@pytest.fixture
def runtime(engine: TorchEngine) -> Iterator[WorkerRuntime]:
    engine.reset()
    yield WorkerRuntime(
        engine, worker_id="w-yield", url="inproc://w-yield", sink=NullSink(),
        metrics=WorkerMetrics(worker_id="w-yield", model_name=engine.model_id),
        limits=Limits(4096, 8, 8192, engine.vocab_size), cache_requests=False,
    )


def _answer(runtime: WorkerRuntime, prompt: list[int]) -> int:
    """The request's cached tokens."""
    result = runtime.generate(prompt, tenant="t", max_tokens=1, temperature=0.0,
                              arrived=time.perf_counter(), emit=lambda step: True)
    assert result is not None
    return result.cached_tokens


def test_a_request_goes_between_the_passes_of_a_warmup(runtime: WorkerRuntime,
                                                       engine: TorchEngine) -> None:
    warm = engine.tokenize(TEXT)[:320]
    asked = engine.tokenize("Question: what does the mill grind in spring?")
    order: list[str] = []
    given: list[float] = []
    original = engine.between_passes
    assert original is not None  # the runtime installed its hook

    def asker() -> None:
        _answer(runtime, asked)
        order.append("request")

    thread = threading.Thread(target=asker)

    def hook() -> float:
        if not thread.is_alive() and not order:  # at the warmup's first pass boundary
            thread.start()
            deadline = time.monotonic() + 10
            while runtime.lock.waiting_requests == 0:
                assert time.monotonic() < deadline, "the request never waited"
                time.sleep(0.001)
        assert original is not None
        given.append(original())
        return given[-1]

    engine.between_passes = hook
    try:
        result = runtime.prefill(warm, tenant="t", source="command")
        order.append("warmup")
    finally:
        engine.between_passes = original
        thread.join(30)
    assert order == ["request", "warmup"]  # it did not wait for the whole prefill
    assert len(given) == len(warm) // PASS - 1 and given[0] > 0  # it yielded once, at first
    assert sum(g > 0 for g in given) == 1
    assert result.computed_tokens == result.n_tokens == 320
    assert _answer(runtime, warm + asked) == 320  # the warm prefix is whole


def test_blocks_evicted_while_a_warmup_yielded_are_stored_again(runtime: WorkerRuntime,
                                                                engine: TorchEngine) -> None:
    tokens = engine.tokenize(TEXT)
    first = runtime.prefill(tokens[:128], tenant="t", source="command")
    assert first.computed_tokens == 128
    original = engine.between_passes
    cleared: list[int] = []

    def hook() -> float:
        if not cleared:  # what a request's admission may do while the warmup waits
            cleared.append(len(engine.cache.clear()))
            engine.sync()
        return 0.0

    engine.between_passes = hook
    try:
        longer = runtime.prefill(tokens[:320], tenant="t", source="command")
    finally:
        engine.between_passes = original
    assert cleared == [1]
    # It reused the first 128 tokens' blocks, which were gone before it stored: its own KV
    # covers them, so the whole chain is held again and served.
    assert longer.computed_tokens == 320 - 128 and longer.n_tokens == 320
    hashes = engine.block_hashes(tokens[:320], tenant="t")
    assert len(engine.held_run(hashes, hit=False)) == len(hashes)
    assert _answer(runtime, tokens[:320] + engine.tokenize("Question: why?")) == 320


def test_a_warmup_finishes_under_back_to_back_requests(engine: TorchEngine) -> None:
    # Two clients keep the engine busy with requests; the warmup still gets a pass each
    # time it has waited the bound (0.2 s here), so it completes while they go on.
    engine.reset()
    metrics = WorkerMetrics(worker_id="w-busy", model_name=engine.model_id)
    runtime = WorkerRuntime(
        engine, worker_id="w-busy", url="inproc://w-busy", sink=NullSink(), metrics=metrics,
        limits=Limits(4096, 8, 8192, engine.vocab_size), cache_requests=False,
        background_max_wait_s=0.2,
    )
    asked = engine.tokenize("Question: what does the mill grind in spring?")
    stop, served = threading.Event(), [0]

    def client() -> None:
        while not stop.is_set():
            _answer(runtime, asked)
            served[0] += 1

    clients = [threading.Thread(target=client) for _ in range(2)]
    for t in clients:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while runtime.lock.waiting_requests == 0:
            assert time.monotonic() < deadline, "the clients never queued"
            time.sleep(0.001)
        before = served[0]
        done: list[int] = []
        warmup = threading.Thread(target=lambda: done.append(
            runtime.prefill(engine.tokenize(TEXT)[:128], tenant="t", source="command")
            .computed_tokens))
        warmup.start()
        warmup.join(60)
        assert done == [128], "the warmup never got the engine"
        assert served[0] > before  # requests went on meanwhile
    finally:
        stop.set()
        for t in clients:
            t.join(30)
    overdue = metrics.registry.get_sample_value("ragwarm_worker_engine_overdue_turns_total")
    assert overdue is not None and overdue >= 1
