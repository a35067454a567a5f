"""The gateway's OpenAI wire format: tenants from keys, request checks, response shapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragwarm.gateway.protocol import (
    ChatRequest,
    CompletionRequest,
    GatewayError,
    Keys,
    Limits,
    Reply,
    Served,
    models_body,
    parse_request,
    sse,
    tenant_for,
)
from tests.unit.conftest import answer

M = Served("m")
LIMITS = Limits(max_tokens=64, max_question_chars=100)
KEYS = Keys({"acme": "sk-acme", "globex": "sk-globex"}, "sk-op", "X-Ragwarm-Tenant", "default")


def bearer(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def test_a_tenant_key_gives_its_tenant() -> None:
    assert tenant_for(KEYS, bearer("sk-acme")) == "acme"
    assert tenant_for(KEYS, bearer("sk-globex", **{"X-Ragwarm-Tenant": "globex"})) == "globex"


def test_the_operator_key_acts_for_the_named_tenant() -> None:
    assert tenant_for(KEYS, bearer("sk-op", **{"X-Ragwarm-Tenant": "globex"})) == "globex"
    assert tenant_for(KEYS, bearer("sk-op")) == "default"


def test_a_tenant_key_cannot_name_another_tenant() -> None:
    with pytest.raises(GatewayError) as err:
        tenant_for(KEYS, bearer("sk-acme", **{"X-Ragwarm-Tenant": "globex"}))
    assert err.value.status == 403


@given(st.text(min_size=0, max_size=40))
def test_any_other_key_is_401_in_openai_shape(key: str) -> None:
    if key.strip() in ("sk-acme", "sk-globex", "sk-op"):
        return
    with pytest.raises(GatewayError) as err:
        tenant_for(KEYS, bearer(key))
    assert err.value.status == 401
    assert err.value.body()["error"]["code"] == "invalid_api_key"


def test_without_keys_the_gateway_is_open() -> None:
    open_keys = Keys({}, None, "X-Ragwarm-Tenant", "default")
    assert tenant_for(open_keys, {}) == "default"
    assert tenant_for(open_keys, {"X-Ragwarm-Tenant": "t1"}) == "t1"


def test_the_question_is_the_last_user_message() -> None:
    req = parse_request(ChatRequest, {"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "How do I "},
                                     {"type": "text", "text": "reset it?"}]}]}, M, LIMITS)
    assert req.question() == "How do I reset it?"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "other", "messages": [{"role": "user", "content": "q"}]}, 404, "model"),
    ({"model": "m", "messages": []}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "q"}], "stop": ""}, 400, "stop"),
    ({"model": "m", "messages": [{"role": "user", "content": "q"}], "stop": list("abcde")},
     400, "stop"),
    ({"model": "m", "messages": [{"role": "user", "content": "q"}], "n": 2}, 400, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 65},
     400, "max_tokens"),
    ([1, 2], 400, None),
])
def test_bad_requests_name_the_field(body, status: int, param: str | None) -> None:
    with pytest.raises(GatewayError) as err:
        parse_request(ChatRequest, body, M, LIMITS)
    assert err.value.status == status and err.value.param == param


def test_a_chat_without_user_text_is_refused() -> None:
    with pytest.raises(GatewayError) as err:
        parse_request(ChatRequest, {"model": "m", "messages": [
            {"role": "system", "content": "x"}]}, M, LIMITS)
    assert err.value.status == 400 and err.value.param == "messages"


def test_a_completion_prompt_batch_of_one_is_the_question() -> None:
    req = parse_request(CompletionRequest, {"model": "m", "prompt": [" why? "]}, M, LIMITS)
    assert req.question() == "why?"
    with pytest.raises(GatewayError):
        parse_request(CompletionRequest, {"model": "m", "prompt": ["a", "b"]}, M, LIMITS)


@pytest.mark.parametrize(("kind", "field", "param"), [
    (ChatRequest, {"messages": [{"role": "user", "content": "x" * 101}]}, "messages"),
    (CompletionRequest, {"prompt": "x" * 101}, "prompt"),
])
def test_a_question_longer_than_the_limit_is_refused(kind, field, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        parse_request(kind, {"model": "m", **field}, M, LIMITS)
    assert (err.value.status, err.value.param) == (400, param)
    assert err.value.code == "question_too_long" and "100" in err.value.message
    just = {k: ([{"role": "user", "content": "x" * 100}] if k == "messages" else "x" * 100)
            for k in field}
    assert len(parse_request(kind, {"model": "m", **just}, M, LIMITS).question()) == 100


USER = [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(("extra", "param"), [
    ({"top_p": 0.9}, "top_p"),
    ({"seed": 7, "temperature": 0.8}, "seed"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": -0.5}, "presence_penalty"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
])
def test_sampling_the_workers_cannot_do_is_refused_in_openai_shape(extra, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        parse_request(ChatRequest, {"model": "m", "messages": USER, **extra}, M, LIMITS)
    body = err.value.body()["error"]
    assert err.value.status == 400
    assert (body["type"], body["param"], body["code"]) == (
        "invalid_request_error", param, "unsupported_parameter")
    assert param in body["message"]


@pytest.mark.parametrize("extra", [
    {"top_p": 1.0}, {"seed": 7}, {"seed": 7, "temperature": 0.0}, {"logprobs": False},
    {"top_logprobs": 0}, {"frequency_penalty": 0.0, "presence_penalty": 0}, {"logit_bias": {}},
    {"stop": "\n"}, {"stop": ["\n", "Q:"]},
])
def test_sampling_fields_that_change_nothing_are_accepted(extra) -> None:
    req = parse_request(ChatRequest, {"model": "m", "messages": USER, **extra}, M, LIMITS)
    assert req.question() == "q"


def test_a_seed_is_refused_when_the_default_temperature_samples() -> None:
    sampling = Limits(max_tokens=64, max_question_chars=100, default_temperature=0.7)
    with pytest.raises(GatewayError) as err:
        parse_request(ChatRequest, {"model": "m", "messages": USER, "seed": 1}, M, sampling)
    assert err.value.param == "seed"


def test_a_completion_asking_for_logprobs_is_refused() -> None:
    with pytest.raises(GatewayError) as err:
        parse_request(CompletionRequest, {"model": "m", "prompt": "q", "logprobs": 0}, M, LIMITS)
    assert err.value.param == "logprobs"


def test_aliases_are_answered_and_listed_beside_the_served_model() -> None:
    served = Served("smollm2", ("gpt-4o-mini", "gpt-4o"))
    req = parse_request(ChatRequest, {"model": "gpt-4o-mini", "messages": USER}, served, LIMITS)
    assert req.model == "gpt-4o-mini"
    with pytest.raises(GatewayError) as err:
        parse_request(ChatRequest, {"model": "gpt-5", "messages": USER}, served, LIMITS)
    assert err.value.status == 404 and err.value.code == "model_not_found"
    assert "gpt-4o-mini" in err.value.message
    listed = models_body(served, 0)["data"]
    assert [m["id"] for m in listed] == ["smollm2", "gpt-4o-mini", "gpt-4o"]
    assert {m["root"] for m in listed} == {"smollm2"}


def test_usage_reports_cached_tokens_and_the_body_is_openai_shaped() -> None:
    body = Reply.new(True, "m").body(answer())
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hi there"}
    assert body["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 672, "blended_tokens": 0, "approx_cached_tokens": 0}
    # How much of the answer's KV was approximate, as the worker reported it.
    mixed = Reply.new(True, "m").body(answer(blended_tokens=96, approx_cached_tokens=128))
    assert mixed["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 672, "blended_tokens": 96, "approx_cached_tokens": 128}
    assert body["usage"]["total_tokens"] == 704
    assert body["ragwarm"]["worker_id"] == "w1"
    text = Reply.new(False, "m").body(answer())
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "Hi there"


def test_stream_chunks_are_openai_shaped() -> None:
    reply = Reply.new(True, "m")
    first = reply.chunk("", role=True)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert reply.chunk("Hi")["choices"][0]["delta"] == {"content": "Hi"}
    assert reply.chunk("", "stop")["choices"][0] == {"index": 0, "finish_reason": "stop",
                                                     "logprobs": None, "delta": {}}
    last = reply.usage_chunk(answer())
    assert last["choices"] == [] and last["usage"]["prompt_tokens_details"]["cached_tokens"] == 672
    framed = sse(last)
    assert framed.startswith(b"data: ") and framed.endswith(b"\n\n")
    assert json.loads(framed[6:]) == last


@pytest.mark.parametrize("keys", [
    Keys({"acme": ""}, None, "X-Ragwarm-Tenant", "default"),
    Keys({"acme": "sk-acme"}, "", "X-Ragwarm-Tenant", "default"),
])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer "}, {"Authorization": ""}])
def test_an_empty_key_never_matches_a_request_without_one(keys: Keys, headers) -> None:
    with pytest.raises(GatewayError) as err:
        tenant_for(keys, headers)
    assert err.value.status == 401
