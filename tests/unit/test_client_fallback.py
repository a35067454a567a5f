"""Routing without the streams app: the worker table, load order, and both clients using it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag.prompt import PromptBuilder
from ragwarm.client.arag import AsyncRagClient
from ragwarm.client.core import ClientConfig
from ragwarm.client.fallback import (
    FALLBACK,
    FALLBACK_STALE,
    ROUTED,
    InFlight,
    WorkerTable,
    by_load,
    fallback_route,
    retrieval_backend,
)
from ragwarm.client.settings import ClientSettings
from ragwarm.client.wire import ClientError, StreamsUnavailable, WorkerRef
from ragwarm.gateway.protocol import extension
from tests.unit.client_fakes import DownCluster, FakeCluster, make_client
from tests.unit.conftest import WordTokenizer

W1, W2, W3 = (WorkerRef(w, f"http://{w}.test") for w in ("w1", "w2", "w3"))
DOWN = StreamsUnavailable("the streams app does not answer at http://streams.test")


# --- pure: the table, load order, the fallback route -----------------------------------------
def test_a_table_is_fresh_until_its_max_age_and_never_when_not_learned():
    table = WorkerTable()
    assert not table.fresh(100.0, 60.0) and table.age_s(100.0) is None
    table.learn([W1, W2, W1], now=100.0)
    assert table.workers == (W1, W2)  # each worker once, first place kept
    assert table.fresh(160.0, 60.0) and not table.fresh(160.5, 60.0)
    assert table.age_s(130.0) == 30.0


def test_learning_an_empty_list_forgets_the_workers():
    table = WorkerTable((W1,), learned_at=1.0)
    table.learn([], now=2.0)
    assert table.workers == () and table.learned_at == 2.0


def test_in_flight_counts_up_and_down_and_never_below_zero():
    load = InFlight()
    load.start("w1"), load.start("w1"), load.start("w2")
    load.end("w1"), load.end("w2"), load.end("w2")
    assert (load.of("w1"), load.of("w2"), load.of("w3")) == (1, 0, 0)
    assert load.counts == {"w1": 1}


def test_fallback_takes_the_least_loaded_worker_and_keeps_the_others_for_failover():
    load = InFlight({"w1": 2, "w2": 1})
    route, routing = fallback_route(WorkerTable((W1, W2, W3), 10.0), load, 20.0, 60.0, DOWN)
    assert route.chosen == W3 and route.workers == (W3, W2, W1) and route.matched_blocks == 0
    assert routing == FALLBACK


def test_fallback_on_an_old_table_says_so():
    _, routing = fallback_route(WorkerTable((W1,), 10.0), InFlight(), 100.0, 60.0, DOWN)
    assert routing == FALLBACK_STALE


def test_fallback_with_no_known_worker_is_the_streams_error_with_why():
    with pytest.raises(StreamsUnavailable, match="does not answer.*no worker is known.*ragwarm up"):
        fallback_route(WorkerTable(), InFlight(), 1.0, 60.0, DOWN)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=6))
def test_by_load_is_a_stable_sort_on_in_flight(loads):
    workers = [WorkerRef(f"w{i}", f"http://w{i}") for i in range(len(loads))]
    load = InFlight({w.worker_id: n for w, n in zip(workers, loads, strict=True) if n})
    ordered = by_load(workers, load)
    keys = [(load.of(w.worker_id), workers.index(w)) for w in ordered]
    assert keys == sorted(keys) and set(ordered) == set(workers)


@pytest.mark.parametrize(("mode", "url", "backend"), [
    ("auto", "http://qdrant:6333", "qdrant"), ("auto", None, "streams"),
    ("streams", "http://qdrant:6333", "streams"), ("qdrant", "http://qdrant:6333", "qdrant"),
])
def test_retrieval_backend_follows_the_setting_and_the_qdrant_url(mode, url, backend):
    assert retrieval_backend(mode, url) == backend


def test_qdrant_retrieval_without_a_url_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="RAGWARM_QDRANT_URL"):
        retrieval_backend("qdrant", None)
    assert ClientSettings().retrieval == "auto"


# --- the clients over a fake cluster whose streams app goes down -----------------------------
OUTAGES = [httpx.ConnectError("refused"), httpx.ReadTimeout("timed out"), 503, 500]


@pytest.mark.parametrize("outage", OUTAGES)
def test_sync_client_routes_by_load_while_the_streams_app_is_down(outage):
    cluster = DownCluster("w2", {"w1": "ok", "w2": "ok"})
    client, emitter = make_client(cluster)
    prepared = client.prepare("How do I reset the admin password?")
    assert client.ask(prepared).routing == ROUTED  # learns the table
    cluster.down = outage
    answer = client.ask(prepared)
    assert (answer.worker_id, answer.routing, answer.matched_blocks) == ("w1", FALLBACK, 0)
    assert answer.cached_tokens == 16 and [e.worker_id for e in emitter.events] == ["w2", "w1"]
    assert extension(answer)["routing"] == FALLBACK
    assert client.in_flight.counts == {}  # every request counted out again


def test_sync_client_learns_the_table_when_it_warms_its_pools():
    cluster = DownCluster("w2", {"w1": "ok", "w2": "ok"})
    client, _ = make_client(cluster)
    client.warm_pools()
    prepared = _prepared(client)
    cluster.down = httpx.ConnectError("refused")
    assert client.table.workers == (W1, W2)
    answer = client.ask(prepared)
    assert answer.routing == FALLBACK and answer.worker_id == "w1"


def _prepared(client):
    """A prepared query built while the streams app was still up (retrieval needs it)."""
    return client.prepare("How do I disable the admin user?")


def test_a_worker_failing_during_a_fallback_is_retried_on_another():
    cluster = DownCluster("w1", {"w1": httpx.ConnectError("refused"), "w2": "ok"})
    client, _ = make_client(cluster)
    client.warm_pools()
    prepared = _prepared(client)
    cluster.down = 503
    answer = client.ask(prepared)
    assert (answer.worker_id, answer.failed_workers, answer.routing) == ("w2", ("w1",), FALLBACK)


def test_with_no_known_worker_the_outage_is_the_clear_error():
    cluster = DownCluster("w1", {"w1": "ok"})
    client, emitter = make_client(cluster)
    prepared = _prepared(client)  # never routed nor warmed: nothing learned
    cluster.down = httpx.ConnectError("refused")
    with pytest.raises(StreamsUnavailable, match="no worker is known"):
        client.ask(prepared)
    assert not emitter.events


def test_retrieval_through_the_down_streams_app_says_what_to_set():
    cluster = DownCluster("w1", {"w1": "ok"})
    client, _ = make_client(cluster)
    client.warm_pools()
    cluster.down = httpx.ConnectError("refused")
    with pytest.raises(StreamsUnavailable, match="RAGWARM_QDRANT_URL"):
        client.query("Why is my app OutOfSync?")


def test_a_refusal_by_the_router_is_not_an_outage():
    cluster = DownCluster("w1", {"w1": "ok"})
    client, _ = make_client(cluster)
    prepared = _prepared(client)
    client.ask(prepared)
    cluster.down = 403
    with pytest.raises(ClientError, match="403") as raised:
        client.ask(prepared)
    assert not isinstance(raised.value, StreamsUnavailable)


# --- the async client (the gateway's) shares the same rules ----------------------------------
def make_async_client(cluster: FakeCluster) -> AsyncRagClient:
    transport = httpx.MockTransport(cluster)
    config = ClientSettings(streams_url="http://streams.test", max_tokens=4, emit_queries=False)
    streams = httpx.AsyncClient(base_url=config.streams_url, transport=transport)
    return AsyncRagClient(ClientConfig(config, "m"),
                          PromptBuilder(WordTokenizer(), "Answer from context."),
                          streams, transport=transport)  # type: ignore[arg-type]


class SlowCluster(DownCluster):
    """Workers answer only once `release` is set, so requests stay in flight together."""

    def __init__(self, chosen, behaviour):
        super().__init__(chosen, behaviour)
        self.release = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "streams.test" and request.url.path == "/v1/completions":
            await self.release.wait()
        return self(request)


async def test_async_client_spreads_concurrent_fallbacks_by_its_own_in_flight_load():
    cluster = SlowCluster("w1", {"w1": "ok", "w2": "ok", "w3": "ok"})
    transport = httpx.MockTransport(cluster.handle)
    config = ClientSettings(streams_url="http://streams.test", max_tokens=4, emit_queries=False)
    client = AsyncRagClient(ClientConfig(config, "m"),
                            PromptBuilder(WordTokenizer(), "Answer from context."),
                            httpx.AsyncClient(base_url=config.streams_url, transport=transport),
                            transport=transport)  # type: ignore[arg-type]
    async with client:
        assert await client.warm_pools() == ["w1", "w2", "w3"]
        prepared = await client.prepare("How do I reset the admin password?")
        cluster.down = httpx.ConnectError("refused")
        tasks = [asyncio.create_task(client.ask(prepared)) for _ in range(3)]
        for _ in range(1000):  # let all three reach their worker before any answers
            if sum(client.in_flight.counts.values()) == 3:
                break
            await asyncio.sleep(0)
        assert client.in_flight.counts == {"w1": 1, "w2": 1, "w3": 1}
        cluster.release.set()
        answers = await asyncio.gather(*tasks)
    assert sorted(a.worker_id for a in answers) == ["w1", "w2", "w3"]
    assert {a.routing for a in answers} == {FALLBACK} and client.in_flight.counts == {}


async def test_async_client_without_a_known_worker_raises_the_clear_error():
    cluster = DownCluster("w1", {"w1": "ok"})
    async with make_async_client(cluster) as client:
        prepared = await client.prepare("q")
        cluster.down = 502
        with pytest.raises(StreamsUnavailable, match="no worker is known"):
            await client.ask(prepared)



def test_ragwarm_query_says_when_a_fallback_chose_the_worker() -> None:
    from ragwarm.cli.query import summary_lines
    from tests.unit.conftest import answer

    routed = "\n".join(summary_lines(answer()))
    assert "worker:  w1\n" in routed + "\n" and "fallback" not in routed
    fell = "\n".join(summary_lines(answer(routing="fallback:streams-unavailable")))
    assert "worker:  w1 (fallback:streams-unavailable)" in fell
