"""The RAG layer loaded beside Faust's start (ragwarm.rag_loading) and the ready probe's
answer while it loads (streams.shell.views.health.ready_body)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from rag.prompt import Layout, PromptBuilder
from rag.retrieve import Retriever
from rag.settings import RagSettings
from ragwarm.rag_loading import LoadingRag, RagLoadFailed
from ragwarm.rag_port import RagService
from ragwarm.settings import ModelSettings
from schemas.prefix import PromptParams
from streams.shell.views.health import ready_body

PARAMS = PromptParams.of(system_prompt="s", top_k=3, model="m", block_size=16)


class FakeService:
    """What LoadingRag forwards to: records its calls."""

    def __init__(self) -> None:
        self.replicated = True
        self.stats: Counter | None = None
        self.closed = False

    def search(self, question: str, tenant: str, k: int) -> list[dict]:
        return [{"question": question, "tenant": tenant, "k": k}]

    def count_embedding(self, stats: Counter) -> None:
        self.stats = stats

    def close(self) -> None:
        self.closed = True


def gated(service: FakeService, gate: threading.Event, parts: list[str] | None = None):
    """An `open` that reports `parts` and returns `service` once `gate` is set."""

    def open_service(on_part):
        for part in parts or []:
            on_part(part)
        gate.wait(5)
        return service

    return open_service


def test_a_call_waits_for_the_load_and_then_runs_on_the_service():
    gate, service = threading.Event(), FakeService()
    rag = LoadingRag(gated(service, gate, ["embedder"]), PARAMS, replicated=True)
    rag.start()
    answers: list = []
    caller = threading.Thread(target=lambda: answers.append(rag.search("q", "t", 2)))
    caller.start()
    caller.join(0.2)
    assert caller.is_alive() and answers == []  # held until the service is there
    assert rag.loading() == "embedder"
    gate.set()
    caller.join(5)
    assert answers == [[{"question": "q", "tenant": "t", "k": 2}]]
    assert rag.loading() is None


def test_prompt_params_and_views_need_no_load():
    gate = threading.Event()
    rag = LoadingRag(gated(FakeService(), gate), PARAMS, replicated=True)
    rag.start()
    assert rag.prompt_params() == PARAMS
    assert rag.loading() == "tokenizer"
    gate.set()


def test_settings_made_before_the_load_reach_the_service():
    gate, service = threading.Event(), FakeService()
    rag = LoadingRag(gated(service, gate), PARAMS, replicated=True)
    stats: Counter = Counter()
    rag.replicated = False  # chunk_replica: nobody follows, so publish nothing
    rag.count_embedding(stats)
    rag.start()
    gate.set()
    rag.loaded(5)
    assert service.replicated is False and service.stats is stats
    rag.replicated = True  # and after it, straight through
    assert service.replicated is True
    rag.close()
    assert service.closed


def test_a_failed_load_is_reported_to_every_caller_and_to_the_process():
    def broken(on_part):
        on_part("index")
        raise RuntimeError("the local Qdrant store is open in another process")

    failures: list[BaseException] = []
    done = threading.Event()
    rag = LoadingRag(broken, PARAMS, replicated=True)
    rag.start(on_failure=lambda exc: (failures.append(exc), done.set()))
    assert done.wait(5)
    assert rag.loading() == "failed"
    with pytest.raises(RagLoadFailed, match="open in another process"):
        rag.search("q", "t", 1)
    assert len(failures) == 1
    rag.close()  # nothing to close


def test_only_the_rag_port_is_forwarded():
    rag = LoadingRag(gated(FakeService(), threading.Event()), PARAMS, replicated=True)
    with pytest.raises(AttributeError):
        rag.store  # noqa: B018 - not part of the port: no silent wait on it
    assert rag.search.__name__ == "search"  # store-thread timings are named after it


def test_params_from_the_settings_equal_those_of_the_loaded_service():
    models = ModelSettings()
    rag = RagSettings()

    class Tokenizer:
        chat_template = None

    service = RagService(
        None, None, Retriever(None, None, rag.top_k),  # type: ignore[arg-type]
        PromptBuilder(Tokenizer(), rag.system_prompt, Layout.plain()), models.llm_name,
    )
    assert service.prompt_params() == RagService.params_of(models, rag)


@pytest.mark.parametrize(
    ("index_ready", "reason", "loading", "status", "said"),
    [
        (True, "ready", None, "ready", None),
        (False, "recovering tables", "embedder", "not_ready",
         "recovering tables; loading the embedder"),
        (True, "ready", "tokenizer", "not_ready", "loading the tokenizer"),
        (False, "re-indexing 2 documents from kb.changes", None, "not_ready",
         "re-indexing 2 documents from kb.changes"),
        (True, "ready", "failed", "not_ready", "the RAG layer failed to load (see the log)"),
    ],
)
def test_the_ready_probe_names_every_part_still_pending(index_ready, reason, loading, status,
                                                        said):
    body = ready_body("app", index_ready, reason, loading)
    assert body["status"] == status
    assert body.get("reason") == said
