"""The remote (OpenAI-compatible server) engine against a real `ragwarm worker` process."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from pydantic import SecretStr

from ragwarm.models import llm_dir
from ragwarm.settings import ModelSettings
from tests.integration.worker_proc import WorkerProc
from workers.engines.protocol import Engine, GenerateRequest
from workers.engines.remote import RemoteEngine, RemoteError, connect_remote_engine
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

API_KEY = "remote-secret"
CONTEXT = (
    "You answer questions about the lighthouse from the notes below.\n"
    "Note 1: The lighthouse stands on the northern cape and was lit in 1874.\n"
    "Note 2: Its lamp was electrified in 1931; the keeper's cottage is now a museum.\n"
)
QUESTION = "Question: when was the lamp electrified?\nAnswer:"


@pytest.fixture(scope="module")
def server(worker_factory: Callable[..., WorkerProc]) -> Iterator[WorkerProc]:
    proc = worker_factory(f"srv-{uuid.uuid4().hex[:8]}", api_key=API_KEY)
    yield proc.start().wait_ready()
    proc.stop()


@pytest.fixture
def engine(server: WorkerProc, tokenizer) -> Iterator[RemoteEngine]:
    settings = WorkerSettings(remote_url=server.url, remote_api_key=SecretStr(API_KEY))
    remote = connect_remote_engine(settings, llm_dir(), tokenizer=tokenizer)
    yield remote
    remote.client.close()


def server_items(server: WorkerProc) -> dict[str, dict]:
    return {i["prefix_hash"]: i for i in server.get("/v1/cache").json()["items"]}


def server_holds(server: WorkerProc, prefix_hash: str, timeout_s: float = 30.0) -> bool:
    """The server caches a request's prompt just after answering it: poll for a moment."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if prefix_hash in server_items(server):
            return True
        time.sleep(0.1)
    return False


def test_connects_to_the_served_model(engine: RemoteEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.served_model == engine.model_id == ModelSettings().llm_name
    assert engine.max_model_len == 8192
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, keys and values, 2-byte server precision.
    assert engine.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2


def test_wrong_key_or_model_is_a_clear_error(server: WorkerProc, tokenizer) -> None:
    bad_key = WorkerSettings(remote_url=server.url, remote_api_key=SecretStr("nope"))
    with pytest.raises(RemoteError, match="401"):
        connect_remote_engine(bad_key, llm_dir(), tokenizer=tokenizer)
    bad_model = WorkerSettings(
        remote_url=server.url, remote_api_key=SecretStr(API_KEY), remote_model="llama-70b"
    )
    with pytest.raises(RemoteError, match="it serves: smollm2"):
        connect_remote_engine(bad_model, llm_dir(), tokenizer=tokenizer)


def test_prefill_warms_the_server_and_generation_reuses_it(
    engine: RemoteEngine, server: WorkerProc
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    prefix = engine.tokenize(CONTEXT)
    ref = ("lighthouse#1", hashlib.sha256(b"note 2").hexdigest())
    result = engine.prefill(prefix, tenant=tenant, chunk_refs=[ref], pin=True)
    full = len(prefix) // 16 * 16
    assert (result.n_tokens, result.computed_tokens) == (full, full)
    assert result.nbytes == full * engine.kv_bytes_per_token
    # The server hashes the same tokens with the same salts: it holds the very same prefix.
    assert server_holds(server, result.prefix_hash)
    assert engine.prefill(prefix, tenant=tenant).computed_tokens == 0

    counters_before = engine.server_counters()
    request = GenerateRequest(prefix + engine.tokenize(QUESTION), max_tokens=8, tenant=tenant)
    steps = list(engine.generate(request))
    counters_after = engine.server_counters()
    final = steps[-1].result
    assert final is not None and all(s.result is None for s in steps[:-1])
    assert final.cached_tokens >= full
    assert final.prompt_tokens == len(prefix) + len(engine.tokenize(QUESTION))
    assert "".join(s.text for s in steps) == final.text
    # The server's vLLM-style counters moved by exactly what usage reported.
    assert counters_before is not None and counters_after is not None
    assert counters_after[0] - counters_before[0] == final.prompt_tokens
    assert counters_after[1] - counters_before[1] == final.cached_tokens

    direct = server.post(
        "/v1/completions",
        {
            "prompt": prefix + engine.tokenize(QUESTION),
            "max_tokens": 8,
            "temperature": 0,
            "tenant": tenant,
            "return_token_ids": True,
        },
    ).json()
    assert list(final.token_ids) == direct["choices"][0]["token_ids"]
    assert final.text == direct["choices"][0]["text"]


def test_invalidation_frees_bookkeeping(engine: RemoteEngine) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ref = ("lighthouse#2", hashlib.sha256(b"note 3").hexdigest())
    result = engine.prefill(engine.tokenize(CONTEXT), tenant=tenant, chunk_refs=[ref])
    used = engine.memory().used
    removed = engine.cache.invalidate([ref])
    assert [e.prefix_hash for e in removed] == [result.prefix_hash]
    assert engine.sync() == result.nbytes
    assert engine.memory().used == used - result.nbytes


def test_a_worker_can_serve_through_the_remote_engine(
    worker_factory: Callable[..., WorkerProc], server: WorkerProc
) -> None:
    proxy = worker_factory(
        f"proxy-{uuid.uuid4().hex[:8]}",
        env={"RAGWARM_WORKER_REMOTE_API_KEY": API_KEY},
        args=["--engine", "remote", "--remote-url", server.url],
    )
    proxy.start().wait_ready()
    try:
        tenant = f"t-{uuid.uuid4().hex[:8]}"
        warmed = proxy.post("/v1/prefill", {"prompt": CONTEXT, "tenant": tenant}).json()
        assert warmed["computed_tokens"] == warmed["prefix_tokens"] > 0
        assert server_holds(server, warmed["prefix_hash"])
        answer = proxy.post(
            "/v1/completions",
            {"prompt": CONTEXT + QUESTION, "max_tokens": 6, "temperature": 0, "tenant": tenant},
        ).json()
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= warmed["prefix_tokens"]
        assert server_holds(proxy, warmed["prefix_hash"])
    finally:
        assert proxy.stop() == 0
