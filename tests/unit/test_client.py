"""RagClient without servers: SSE parsing, worker order, retries and the query event it emits."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragwarm.client.contract import PromptMismatch
from ragwarm.client.core import build_answer
from ragwarm.client.rag import query_event
from ragwarm.client.wire import (
    ClientError,
    Failover,
    NoWorker,
    RequestRejected,
    Route,
    StreamResult,
    StreamsUnavailable,
    WorkerFailed,
    WorkerRef,
    candidates,
    sse_data,
    status_error,
    workers_to_try,
)
from schemas.prefix import PromptChain, block_hashes
from streams.shell.views.health import health_body as streams_health_body
from tests.unit.client_fakes import (
    BROKEN,
    FakeCluster,
    make_client,
    sse_chunk,
)


# --- SSE ------------------------------------------------------------------------------------
def test_sse_data_joins_multiline_data_and_skips_comments_and_other_fields():
    lines = [": keep-alive", "event: x", "data: a", "data:b", "id: 7", "", "data: [DONE]", ""]
    assert list(sse_data(lines)) == ["a\nb", "[DONE]"]


def test_sse_data_drops_an_unterminated_event():
    assert list(sse_data(["data: {}", "", 'data: {"half'])) == ["{}"]


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n"), max_size=30), max_size=20)
)
def test_sse_data_round_trips_any_payloads(payloads):
    lines = [line for p in payloads for line in (f"data: {p}", "")]
    assert list(sse_data(lines)) == payloads


def test_an_answer_carries_the_workers_blended_and_approximate_token_counts():
    client, _ = make_client(FakeCluster("w1", {"w1": "ok"}))
    prepared = client.prepare("How do I reset the admin password?", "acme")
    result = StreamResult(sent_at=1.0)
    result.usage = {"prompt_tokens": 40, "completion_tokens": 2, "prompt_tokens_details": {
        "cached_tokens": 32, "blended_tokens": 4, "approx_cached_tokens": 16}}
    answer = build_answer(prepared, W1, result, [], 0.5, 1.0, 2)
    assert (answer.cached_tokens, answer.blended_tokens, answer.approx_cached_tokens) == (32, 4, 16)


def test_stream_result_collects_text_first_token_time_and_usage():
    result = StreamResult(sent_at=1.0)
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 32},
        "ttft_ms": 5.0,
    }
    assert result.feed(sse_chunk("Hel"), 1.25) == "Hel"
    assert result.feed(sse_chunk("lo", "length"), 1.5) == "lo"
    result.feed(json.dumps({"choices": [], "usage": usage}), 1.6)
    result.feed("[DONE]", 1.7)
    result.check_complete()
    assert (result.text, result.first_at, result.finish_reason) == ("Hello", 1.25, "length")
    assert result.usage == usage


@pytest.mark.parametrize(
    "events",
    [
        [sse_chunk("a")],  # no finish reason, no [DONE]
        [sse_chunk("a", "stop")],  # no [DONE]
        ["[DONE]"],  # nothing generated
    ],
)
def test_an_incomplete_stream_is_a_worker_failure(events):
    result = StreamResult(sent_at=0.0)
    for data in events:
        result.feed(data, 0.1)
    with pytest.raises(WorkerFailed):
        result.check_complete()


@pytest.mark.parametrize(
    "data", ['{"error": {"message": "generation failed: boom"}}', "not json", "[1, 2]"]
)
def test_error_or_malformed_events_are_worker_failures(data):
    with pytest.raises(WorkerFailed):
        StreamResult(sent_at=0.0).feed(data, 0.1)


# --- worker order -----------------------------------------------------------------------------
W1, W2, W3 = (WorkerRef(f"w{i}", f"http://127.0.0.1:{8100 + i}") for i in (1, 2, 3))


def test_candidates_start_with_the_chosen_worker_then_the_others_once():
    route = Route(chosen=W2, matched_blocks=4, workers=(W1, W2, W3))
    assert candidates(route, 3) == [W2, W1, W3]
    assert candidates(route, 2) == [W2, W1]
    assert candidates(Route(None, 0, (W1, W1, W3)), 5) == [W1, W3]
    assert candidates(Route(None, 0, (W3, W1, W3)), 5) == [W3, W1]
    assert candidates(Route(None, 0, ()), 3) == []


@pytest.mark.parametrize("status,kind", [(200, None), (500, WorkerFailed), (503, WorkerFailed),
                                         (429, WorkerFailed), (400, RequestRejected),
                                         (401, RequestRejected), (413, RequestRejected)])
def test_status_error_retries_server_trouble_and_rejects_refusals(status, kind):
    error = status_error(W1, status, "why")
    assert (error is None) if kind is None else (type(error) is kind and "why" in str(error))


def test_failover_names_every_failed_worker_and_why():
    failover = Failover()
    failover.worker_failed(W1, WorkerFailed("HTTP 503: busy"))
    failover.worker_failed(W3, WorkerFailed("ConnectError: refused"))
    assert failover.failed == [W1.worker_id, W3.worker_id]
    message = str(failover.exhausted())
    assert "HTTP 503: busy" in message and "ConnectError" in message


def test_workers_to_try_without_any_worker_names_the_fix():
    with pytest.raises(NoWorker, match="ragwarm up"):
        workers_to_try(Route(None, 0, ()), 3, "http://streams:6066")
    assert workers_to_try(Route(W2, 1, (W1, W2)), 3, "x") == [W2, W1]


def test_route_from_json_skips_workers_without_url():
    raw = {
        "worker_id": "w2",
        "url": W2.url,
        "matched_blocks": 3,
        "workers": [{"worker_id": "w1", "url": None}, {"worker_id": "w2", "url": W2.url}],
    }
    assert Route.from_json(raw) == Route(W2, 3, (W2,))
    assert Route.from_json({"worker_id": None, "url": None, "workers": []}).chosen is None


@given(
    st.lists(st.sampled_from([W1, W2, W3]), max_size=6),
    st.sampled_from([None, W1, W2]),
    st.integers(1, 5),
)
def test_candidates_never_repeat_and_respect_the_limit(workers, chosen, limit):
    order = candidates(Route(chosen, 0, tuple(workers)), limit)
    assert len(order) == len({w.worker_id for w in order}) <= limit
    listed = list(dict.fromkeys(([chosen] if chosen else []) + workers))
    assert order == listed[:limit]  # first appearance order, chosen first


# --- the client over fake servers ---------------------------------------------------------------
def test_warm_pools_opens_a_connection_to_the_streams_app_and_every_worker():
    cluster = FakeCluster("w1", {"w1": "ok", "w2": "ok"})
    client, _ = make_client(cluster)
    assert client.warm_pools() == ["w1", "w2"]
    assert {"w1.test/health/live", "w2.test/health/live", "streams.test/ragwarm/health"} <= set(
        cluster.calls
    )


def test_query_goes_to_the_routed_worker_and_emits_its_query_event():
    cluster = FakeCluster("w2", {"w1": "ok", "w2": "ok"})
    client, emitter = make_client(cluster, tenant="acme")
    tokens: list[str] = []
    answer = client.query("How do I reset the admin password?", on_token=tokens.append)
    assert (answer.worker_id, answer.text, answer.cached_tokens) == ("w2", "Hi there", 16)
    assert answer.worker_ttft_ms == 3.5 and answer.ttft_ms >= 0 and answer.failed_workers == ()
    assert "".join(tokens) == "Hi there"
    body = cluster.bodies[0]
    assert body["tenant"] == "acme" and body["stream"] is True and body["max_tokens"] == 4
    assert [r["chunk_id"] for r in body["chunk_refs"]] == ["docs/faq.md#0", "docs/faq.md#1"]
    (event,) = emitter.events
    prepared = client.prepare("How do I reset the admin password?", "acme")
    prefix = block_hashes(prepared.prompt.prefix_ids, tenant="acme", model="m")
    assert event.prefix_hash == prefix[-1] == answer.prefix_hash
    assert event.block_hashes == prefix and event.prefix_tokens == prepared.prompt.prefix_len
    assert (event.qid, event.worker_id, event.tenant) == (answer.qid, "w2", "acme")
    assert body["prompt"] == list(prepared.prompt.token_ids)


ERROR = b'data: {"error": {"message": "generation failed"}}\n\ndata: [DONE]\n\n'


@pytest.mark.parametrize(
    "failure", [httpx.ConnectError("refused"), 503, 500, BROKEN, ERROR, httpx.ReadError("reset")]
)
def test_a_failing_worker_is_retried_on_the_next_one(failure):
    cluster = FakeCluster("w2", {"w1": "ok", "w2": failure})
    client, emitter = make_client(cluster)
    answer = client.query("How do I disable the admin user?")
    assert answer.worker_id == "w1" and answer.failed_workers == ("w2",)
    assert answer.matched_blocks == 0  # the answering worker was not the one holding the prefix
    assert [e.worker_id for e in emitter.events] == ["w1"]


def test_a_request_a_worker_refuses_is_not_retried():
    cluster = FakeCluster("w2", {"w1": "ok", "w2": 400})
    client, emitter = make_client(cluster)
    with pytest.raises(RequestRejected, match="HTTP 400"):
        client.query("How do I disable the admin user?")
    assert not emitter.events


def test_every_worker_failing_is_one_clear_error():
    cluster = FakeCluster("w1", {"w1": 503, "w2": httpx.ConnectError("refused")})
    client, emitter = make_client(cluster)
    with pytest.raises(ClientError, match="w1: HTTP 503.*w2: ConnectError"):
        client.query("Why is my app OutOfSync?")
    assert not emitter.events


def test_no_worker_at_all_names_the_command_to_start_one():
    client, _ = make_client(FakeCluster(None, {}))
    with pytest.raises(NoWorker, match="ragwarm up"):
        client.query("Why is my app OutOfSync?")


def test_query_event_of_a_prompt_shorter_than_a_block_has_no_prefix_hash():
    cluster = FakeCluster("w1", {"w1": "ok"})
    client, _ = make_client(cluster)
    prepared = client.prepare("q")
    short = prepared.__class__(
        prepared.question, prepared.tenant, (), prepared.prompt, PromptChain((), 0), 0.0
    )
    answer = client.ask(short)
    assert query_event(short, answer).prefix_hash is None


class ContractCluster(FakeCluster):
    """A FakeCluster whose health view publishes `params`, counting the times it is asked."""

    def __init__(self):
        super().__init__("w1", {"w1": "ok"})
        self.params, self.health_asked = None, 0

    def streams(self, path: str, request: httpx.Request) -> httpx.Response:
        if path == "/ragwarm/health":
            self.health_asked += 1
            return httpx.Response(200, json=streams_health_body("app", self.params))
        return super().streams(path, request)


def test_a_client_opened_without_the_app_checks_its_prompt_contract_once_it_answers():
    cluster = ContractCluster()
    client, _ = make_client(cluster)
    cluster.params = client.config.params
    client.opened_without_streams(StreamsUnavailable("down"))
    assert client.contract_pending
    client.query("How do I sync?")
    client.query("How do I sync?")
    assert not client.contract_pending and cluster.health_asked == 1


def test_an_app_that_builds_prompts_otherwise_is_refused_when_it_first_answers():
    cluster = ContractCluster()
    client, emitter = make_client(cluster)
    cluster.params = client.config.params.model_copy(update={"top_k": client.config.top_k + 1})
    client.opened_without_streams(StreamsUnavailable("down"))
    with pytest.raises(PromptMismatch, match="RAGWARM_RAG_TOP_K"):
        client.query("How do I sync?")
    assert client.contract_pending and emitter.events == []
