"""The gateway's client's own worker view (issue 40): worker.events folded as the streams app folds
them, routing by it while fresh, by load once stale, and the retrieval plan."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import httpx
import pytest

from rag.prompt import PromptBuilder
from ragwarm.client.core import ClientConfig
from ragwarm.client.fallback import ROUTED, InFlight
from ragwarm.client.feeds import worker_events_apply
from ragwarm.client.independent import (
    GatewayClient,
    ReplicaNotReady,
    RetrievalPlan,
    retrieval_plan,
)
from ragwarm.client.settings import ClientSettings
from ragwarm.client.view import (
    EVENTS,
    FALLBACK_STALE_VIEW,
    ViewRules,
    WorkerView,
    fresh_route,
    stale_route,
)
from ragwarm.client.wire import NoWorker, RetrievedChunk, WorkerRef
from schemas import WorkerEvent, encode
from schemas.signing import derive_worker_key, sign
from streams.decide.fleet import route_answer
from tests.unit.client_fakes import DownCluster
from tests.unit.conftest import WordTokenizer

MASTER = "the-master-signing-secret"
NOW = 1_000_000.0  # wall clock, seconds
EPOCH = int((NOW - 100) * 1_000_000)


def event(worker_id: str, kind: str = "heartbeat", prefixes: tuple[str, ...] = (),
          epoch: int = EPOCH, signed: bool = True, **fields) -> WorkerEvent:
    e = WorkerEvent(worker_id=worker_id, kind=kind, url=f"http://{worker_id}.test",
                    mem_total_bytes=1000, warm_prefixes=list(prefixes), epoch=epoch, **fields)
    return sign(e, derive_worker_key(MASTER.encode(), worker_id).encode()) if signed else e


def view(master: str | None = MASTER) -> WorkerView:
    return WorkerView(ViewRules(master, worker_stale_s=30.0, quiet_s=15.0))


H = [c * 64 for c in "abcd"]  # a prompt's block hashes


# --- the view: the streams app's fold -----------------------------------------------------------
def test_signed_events_fill_the_view_and_forged_or_unsigned_ones_are_ignored():
    v = view()
    assert v.apply(event("w1", prefixes=(H[0],)), NOW) == "new"
    forged = event("w1", prefixes=(H[0], H[1]), signed=False)
    assert v.apply(forged, NOW) == "unauthenticated"
    # Signed with another worker's key: the key is derived per worker id.
    other = sign(event("w1", signed=False, prefixes=(H[1],)),
                 derive_worker_key(MASTER.encode(), "w2").encode())
    assert v.apply(other, NOW) == "unauthenticated"
    assert v.rows["w1"].prefixes == [H[0]] and v.ignored["unauthenticated"] == 2


def test_without_a_secret_unsigned_events_count_as_the_app_counts_them():
    v = view(master=None)
    assert v.apply(event("w1", signed=False), NOW) == "new"
    assert v.rows["w1"].ready


def test_an_event_of_an_older_boot_changes_nothing_and_a_new_boot_starts_empty():
    v = view()
    v.apply(event("w1", prefixes=(H[0],)), NOW)
    assert v.apply(event("w1", prefixes=(H[1],), epoch=EPOCH - 1), NOW) == "old"
    assert v.rows["w1"].prefixes == [H[0]]
    assert v.apply(event("w1", kind="ready", epoch=EPOCH + 1), NOW + 1) == "new"
    assert v.rows["w1"].prefixes == [] and v.rows["w1"].epoch == EPOCH + 1


def test_stored_and_evicted_events_move_the_prefixes_held():
    v = view()
    v.apply(event("w1"), NOW)
    v.apply(event("w1", kind="stored", prefix_hash=H[2]), NOW + 1)
    assert v.rows["w1"].prefixes == [H[2]]
    v.apply(event("w1", kind="evicted", prefix_hash=H[2]), NOW + 2)
    assert v.rows["w1"].prefixes == []


# --- routing by the view ------------------------------------------------------------------------
def test_a_fresh_view_routes_as_the_streams_app_would_on_the_same_rows():
    v = view()
    v.apply(event("w1", prefixes=(H[0],)), NOW)
    v.apply(event("w2", prefixes=(H[0], H[1], H[2])), NOW)
    route = fresh_route(v, H, NOW + 5)
    assert route is not None and route.chosen == WorkerRef("w2", "http://w2.test")
    assert route.matched_blocks == 3
    assert route_answer(v.live(NOW + 5), H)["worker_id"] == "w2"  # one decision, shared


def test_a_quiet_view_gives_no_fresh_route_and_a_stale_one_goes_by_load():
    v = view()
    v.apply(event("w1", prefixes=tuple(H)), NOW)
    v.apply(event("w2"), NOW)
    assert fresh_route(v, H, NOW + 15) is not None
    assert fresh_route(v, H, NOW + 16) is None  # no event for three heartbeats
    route = stale_route(v, InFlight({"w1": 2, "w2": 0}))
    assert route is not None and route.chosen is not None
    assert route.chosen.worker_id == "w2" and route.matched_blocks == 0  # no match claimed
    assert [w.worker_id for w in route.workers] == ["w2", "w1"]  # the other for failover


def test_a_stopped_worker_is_neither_routed_to_nor_kept_for_failover():
    v = view()
    v.apply(event("w1"), NOW)
    v.apply(event("w2"), NOW)
    v.apply(event("w2", kind="stopped"), NOW + 1)
    route = stale_route(v, InFlight())
    assert route is not None and [w.worker_id for w in route.workers] == ["w1"]
    assert stale_route(view(), InFlight()) is None  # nothing known: the caller decides


def test_records_are_folded_at_their_own_time_and_malformed_ones_counted():
    v = view()
    apply = worker_events_apply(v, clock=lambda: NOW)
    records = [SimpleNamespace(value=encode(event("w1")), timestamp=(NOW - 60) * 1000),
               SimpleNamespace(value=b"{not json", timestamp=NOW * 1000),
               SimpleNamespace(value=encode(event("w2")), timestamp=(NOW + 3600) * 1000)]
    apply(records)
    assert v.ignored["malformed"] == 1
    assert v.rows["w1"].last_seen == NOW - 60  # read back after a restart: as old as it is
    assert v.rows["w2"].last_seen == NOW  # a clock ahead never makes a row look fresher
    assert not v.live(NOW)[0].ready  # w1: heard from 60 s ago, past the 30 s horizon


# --- the gateway's client -----------------------------------------------------------------------
def gateway_client(cluster: DownCluster, v: WorkerView | None) -> GatewayClient:
    transport = httpx.MockTransport(cluster)
    config = ClientSettings(streams_url="http://streams.test", max_tokens=4, emit_queries=False)
    streams = httpx.AsyncClient(base_url=config.streams_url, transport=transport)
    client = GatewayClient(ClientConfig(config, "m"),
                           PromptBuilder(WordTokenizer(), "Answer from context."),  # type: ignore[arg-type]
                           streams, transport=transport)
    client.attach(v, None, ())
    return client


def live_view(*rows: tuple[str, tuple[str, ...]]) -> WorkerView:
    import time

    v = view()
    for worker_id, prefixes in rows:
        v.apply(event(worker_id, prefixes=prefixes), time.time())
    return v


async def test_the_gateway_routes_by_its_fresh_view_without_asking_the_streams_app():
    cluster = DownCluster("w1", {"w1": "ok", "w2": "ok"})
    async with gateway_client(cluster, None) as client:
        prepared = await client.prepare("how do I reset the password?")
        v = live_view(("w1", ()), ("w2", tuple(prepared.block_hashes[:1])))
        client.attach(v, None, ())
        cluster.down = httpx.ConnectError("refused")
        answer = await client.ask(prepared)
    assert (answer.worker_id, answer.routing, answer.matched_blocks) == ("w2", EVENTS, 1)
    assert "streams.test/ragwarm/route" not in cluster.calls


async def test_with_a_stale_view_the_streams_app_routes_and_without_it_the_view_by_load():
    cluster = DownCluster("w1", {"w1": "ok", "w2": "ok"})
    async with gateway_client(cluster, view()) as client:
        stale = client.view
        assert stale is not None
        assert stale.apply(event("w2", epoch=1), 1.0) == "new"  # long ago: not fresh
        prepared = await client.prepare("how do I reset the password?")
        routed = await client.ask(prepared)
        cluster.down = httpx.ConnectError("refused")
        fallback = await client.ask(prepared)
    assert (routed.worker_id, routed.routing) == ("w1", ROUTED)
    assert (fallback.worker_id, fallback.routing) == ("w2", FALLBACK_STALE_VIEW)


class StaleAppCluster(DownCluster):
    """The app answers, but its table marks every worker gone (no heartbeat for a while)."""

    def streams(self, path, request):
        if path == "/ragwarm/route":
            return httpx.Response(200, json={"worker_id": None, "url": None,
                                             "matched_blocks": 0, "workers": []})
        return super().streams(path, request)


async def test_when_the_apps_table_is_stale_too_the_view_routes_by_load():
    """The broker away past the app's worker horizon: its route names no worker."""
    cluster = StaleAppCluster(None, {"w1": "ok"})
    async with gateway_client(cluster, view()) as client:
        prepared = await client.prepare("how do I reset the password?")
        with pytest.raises(NoWorker):  # nothing known to the view either
            await client.ask(prepared)
        stale = client.view
        assert stale is not None and stale.apply(event("w1", epoch=1), 1.0) == "new"
        answer = await client.ask(prepared)
    assert (answer.worker_id, answer.routing) == ("w1", FALLBACK_STALE_VIEW)


async def test_a_worker_failing_mid_request_is_retried_on_the_next_the_view_names():
    cluster = DownCluster(None, {"w1": httpx.ReadError("reset"), "w2": "ok"})
    async with gateway_client(cluster, None) as client:
        prepared = await client.prepare("how do I reset the password?")
        client.attach(live_view(("w1", tuple(prepared.block_hashes)), ("w2", ())), None, ())
        answer = await client.ask(prepared)
    assert (answer.worker_id, answer.failed_workers, answer.routing) == ("w2", ("w1",), EVENTS)


async def test_replica_retrieval_refuses_while_the_replica_catches_up():
    cluster = DownCluster("w1", {"w1": "ok"})
    async with gateway_client(cluster, None) as client:
        client.attach(None, None, (), replica_only=True)
        with pytest.raises(ReplicaNotReady, match="still reading rag.chunks"):
            await client.prepare("a question?")
        client.attach(None, None, (), replica_only=False)  # auto: the streams app meanwhile
        assert (await client.prepare("a question?")).chunks


class FakeReplica:
    def __init__(self, chunks: list[RetrievedChunk]) -> None:
        self.chunks = chunks

    def retrieve(self, question: str, tenant: str, k: int) -> list[RetrievedChunk]:
        return self.chunks[:k]

    def close(self) -> None:
        pass


def caught_up_feed() -> SimpleNamespace:
    done = threading.Event()
    done.set()
    return SimpleNamespace(topic="ns.rag.chunks", caught_up=done, records=3, close=lambda: None)


async def test_a_caught_up_replica_retrieves_and_auto_asks_the_app_when_it_finds_nothing():
    cluster = DownCluster("w1", {"w1": "ok"})
    mine = RetrievedChunk("docs/a.md#0", "e" * 64, "docs/a.md", "From the replica.")
    async with gateway_client(cluster, None) as client:
        client.attach(None, FakeReplica([mine]), (caught_up_feed(),))  # type: ignore[arg-type]
        assert (await client.prepare("a question?")).chunks == (mine,)
        assert "streams.test/ragwarm/retrieve" not in cluster.calls
        client.attach(None, FakeReplica([]), (caught_up_feed(),))  # type: ignore[arg-type]
        assert (await client.prepare("a question?")).chunks[0].doc_id == "docs/faq.md"
        cluster.down = httpx.ConnectError("refused")
        assert (await client.prepare("a question?")).chunks == ()  # nothing, not an error


# --- the retrieval plan -------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "url", "plan"), [
    ("auto", "http://qdrant:6333", RetrievalPlan("qdrant")),
    ("auto", None, RetrievalPlan("streams", replica=True)),
    ("replica", "http://qdrant:6333", RetrievalPlan("streams", replica=True, replica_only=True)),
    ("streams", "http://qdrant:6333", RetrievalPlan("streams")),
    ("qdrant", "http://qdrant:6333", RetrievalPlan("qdrant")),
])
def test_the_retrieval_plan(mode, url, plan):
    assert retrieval_plan(mode, url) == plan


def test_qdrant_retrieval_without_a_url_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="RAGWARM_QDRANT_URL"):
        retrieval_plan("qdrant", None)
