"""The client core: one configuration resolved at open, and the rules the sync and async
shells share (listing workers, failing over, a partial answer that cannot be restarted)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rag.prompt import PromptBuilder
from rag.settings import RagSettings
from ragwarm.client.arag import AsyncRagClient, PartialAnswerLost
from ragwarm.client.core import ClientConfig
from ragwarm.client.settings import ClientSettings
from ragwarm.client.wire import (
    ClientError,
    StreamResult,
    StreamsUnavailable,
    WorkerFailed,
    WorkerRef,
)
from ragwarm.settings import ModelSettings
from schemas.prefix import BLOCK_SIZE, PromptParams
from tests.unit.client_fakes import BROKEN, FakeCluster, make_client
from tests.unit.conftest import WordTokenizer

QUESTION = "How do I reset the admin password?"


class ListingCluster(FakeCluster):
    """A FakeCluster whose /ragwarm/workers answers `listing` (a status code) when set."""

    listing: int | None = None

    def streams(self, path, request):
        if path == "/ragwarm/workers" and self.listing is not None:
            return httpx.Response(self.listing, text="no")
        return super().streams(path, request)


def async_client(cluster: FakeCluster) -> AsyncRagClient:
    transport = httpx.MockTransport(cluster)
    settings = ClientSettings(streams_url="http://streams.test", max_tokens=4, emit_queries=False)
    streams = httpx.AsyncClient(base_url=settings.streams_url, transport=transport)
    return AsyncRagClient(ClientConfig(settings, "m"),
                          PromptBuilder(WordTokenizer(), "Answer from context."), streams,
                          transport=transport)  # type: ignore[arg-type]


def test_resolve_reads_each_setting_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGWARM_QDRANT_URL", raising=False)
    rag = RagSettings(top_k=5, system_prompt="Be brief.")
    config = ClientConfig.resolve(ClientSettings(emit_queries=False),
                                  models=ModelSettings(llm_name="tiny"), rag=rag)
    assert (config.model_salt, config.top_k, config.retrieval) == ("tiny", 5, "streams")
    assert config.kafka is None  # queries are not published: no producer settings
    assert config.params == PromptParams.of(system_prompt="Be brief.", top_k=5, model="tiny",
                                            block_size=BLOCK_SIZE)
    with pytest.raises(ValueError, match="RAGWARM_QDRANT_URL"):
        ClientConfig.resolve(ClientSettings(retrieval="qdrant", emit_queries=False))


def test_the_bearer_key_goes_in_the_headers() -> None:
    assert ClientConfig(ClientSettings(), "m").headers == {}
    keyed = ClientConfig(ClientSettings(api_key="k-1"), "m")  # type: ignore[arg-type]
    assert keyed.headers == {"Authorization": "Bearer k-1"}


@pytest.mark.parametrize("status,error", [(403, None), (500, StreamsUnavailable),
                                          (404, ClientError)])
def test_both_shells_read_the_worker_list_alike(status: int, error: type | None) -> None:
    cluster = ListingCluster("w1", {"w1": "ok"})
    cluster.listing = status
    sync, _ = make_client(cluster)
    aclient = async_client(cluster)
    if error is None:  # a tenant key may not list workers: nothing warmed, nothing learned
        assert sync.warm_pools() == [] == asyncio.run(aclient.warm_pools())
        assert sync.table.learned_at is None and aclient.table.learned_at is None
        return
    with pytest.raises(error, match=str(status)):
        sync.warm_pools()
    with pytest.raises(error, match=str(status)):
        asyncio.run(aclient.warm_pools())


def test_a_broken_worker_is_replaced_and_the_answer_restarted() -> None:
    cluster = FakeCluster("w1", {"w1": BROKEN, "w2": "ok"})
    client, _ = make_client(cluster)
    tokens: list[str] = []
    answer = client.query(QUESTION, on_token=tokens.append)
    assert (answer.worker_id, answer.failed_workers) == ("w2", ("w1",))
    assert "".join(tokens) == "Hi" + "Hi there"  # the answer starts again on w2
    assert client.in_flight.counts == {}


def test_without_restart_a_partial_answer_is_not_restarted_elsewhere() -> None:
    cluster = FakeCluster("w1", {"w1": BROKEN, "w2": "ok"})
    client = async_client(cluster)
    sent: list[str] = []

    async def on_token(text: str) -> None:
        sent.append(text)

    async def ask(restart: bool):
        return await client.query(QUESTION, on_token=on_token, restart_on_retry=restart)

    with pytest.raises(PartialAnswerLost, match="w1"):
        asyncio.run(ask(False))
    assert sent == ["Hi"] and client.in_flight.counts == {}
    assert asyncio.run(ask(True)).worker_id == "w2"


def test_an_attempt_counts_in_flight_and_turns_a_broken_connection_into_a_failure() -> None:
    client, _ = make_client(FakeCluster("w1", {"w1": "ok"}))
    worker = WorkerRef("w1", "http://w1.test")
    result = StreamResult(sent_at=0.0)
    with pytest.raises(WorkerFailed, match="ConnectError"), client.attempt(worker, result):
        assert client.in_flight.counts == {"w1": 1}
        raise httpx.ConnectError("refused")
    assert client.in_flight.counts == {}
    with pytest.raises(WorkerFailed, match="before the answer was complete"), \
            client.attempt(worker, result):
        pass  # nothing streamed: the attempt did not complete the answer
