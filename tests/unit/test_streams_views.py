"""The views' pure parts: request bodies, the route answer, the health body."""

from __future__ import annotations

import json

import pytest

from schemas.prefix import PromptParams
from streams.decide.fleet import route_answer
from streams.decide.records import WorkerState
from streams.shell.views.bodies import (
    MAX_BODY_BYTES,
    MAX_K,
    BadRequest,
    RetrieveBody,
    RouteBody,
    parse_body,
)
from streams.shell.views.health import health_body


def test_a_valid_retrieve_body_gets_its_defaults():
    body = parse_body(b'{"question": "why?"}', RetrieveBody)
    assert (body.question, body.tenant, body.k) == ("why?", None, 3)


@pytest.mark.parametrize(
    ("raw", "status", "names"),
    [
        (b"not json", 400, "not JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"{}", 400, "question"),
        (b'{"question": "   "}', 400, "question"),
        (b'{"question": "q", "k": 0}', 400, "k"),
        (json.dumps({"question": "q", "k": MAX_K + 1}).encode(), 400, "k"),
        (b'{"question": "q", "k": true}', 400, "k"),
        (b'{"question": "q", "k": "3"}', 400, "k"),
        (b'{"question": "q", "tenant": 7}', 400, "tenant"),
        (b'{"question": "q", "top_k": 3}', 400, "top_k"),
        (json.dumps({"question": "q" * 9000}).encode(), 400, "question"),
        (b" " * (MAX_BODY_BYTES + 1), 413, "larger"),
    ],
)
def test_a_bad_retrieve_body_is_refused_naming_what_is_wrong(raw, status, names):
    with pytest.raises(BadRequest) as caught:
        parse_body(raw, RetrieveBody)
    assert caught.value.status == status and names in caught.value.message


@pytest.mark.parametrize("body", [{}, {"block_hashes": "ab"}, {"block_hashes": [1]},
                                  {"block_hashes": ["a"] * 5000}])
def test_a_bad_route_body_is_refused(body):
    with pytest.raises(BadRequest, match="block_hashes"):
        parse_body(json.dumps(body).encode(), RouteBody)


def worker(worker_id: str, prefixes: list[str], ready: bool = True) -> WorkerState:
    return WorkerState(worker_id=worker_id, url=f"http://{worker_id}", ready=ready,
                       mem_total=100, prefixes=prefixes)


def test_the_route_goes_to_the_ready_worker_holding_the_longest_prefix():
    workers = [worker("a", ["h1"]), worker("b", ["h1", "h2"]), worker("c", ["h1", "h2", "h3"],
                                                                         ready=False)]
    answer = route_answer(workers, ["h1", "h2", "h3"])
    assert (answer["worker_id"], answer["url"], answer["matched_blocks"]) == ("b", "http://b", 2)
    assert [w["worker_id"] for w in answer["workers"]] == ["a", "b"]


def test_no_ready_worker_routes_nowhere():
    answer = route_answer([worker("a", [], ready=False)], ["h1"])
    assert answer == {"worker_id": None, "url": None, "matched_blocks": 0, "workers": []}


def test_the_health_body_publishes_the_prompt_parameters_and_their_digest():
    params = PromptParams.of(system_prompt="s", top_k=3, model="m", block_size=16)
    body = health_body("app", params)
    assert body["prompt"]["digest"] == params.digest()
    assert PromptParams.model_validate(body["prompt"]["params"]) == params


def test_with_no_holder_the_route_takes_the_coldest_worker():
    busy = worker("a", []).model_copy(update={"mem_used": 90})
    idle = worker("b", []).model_copy(update={"mem_used": 10})
    assert route_answer([busy, idle], ["h1"])["worker_id"] == "b"
