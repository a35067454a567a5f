"""The gateway's HTTP surface without a stack: keys, errors and readiness in OpenAI's shape."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr, ValidationError

from ragwarm.client.settings import ClientSettings
from ragwarm.client.wire import StreamsUnavailable
from ragwarm.gateway.app import GatewayState, build_app
from ragwarm.gateway.settings import GatewaySettings


async def never_opens():
    await asyncio.sleep(0)
    raise StreamsUnavailable("the streams app does not answer")


def state(**settings_kw) -> GatewayState:
    settings = GatewaySettings(keys={"acme": SecretStr("sk-acme")}, open_retry_s=30,
                               **settings_kw)
    return GatewayState(settings, ClientSettings(), "smollm2", never_opens)


async def test_wrong_key_is_401_and_health_needs_none() -> None:
    async with TestClient(TestServer(build_app(state()))) as client:
        wrong = await client.post("/v1/chat/completions", json={},
                                  headers={"Authorization": "Bearer sk-nope"})
        assert wrong.status == 401
        assert (await wrong.json())["error"]["code"] == "invalid_api_key"
        assert (await client.get("/health/live")).status == 200
        ready = await client.get("/health/ready")
        assert ready.status == 503 and "streams app" in (await ready.json())["reason"]
        health = await client.get("/health")  # vLLM's probe: 200 only once it can answer
        assert health.status == 503 and "streams app" in (await health.json())["reason"]


async def test_models_lists_the_model_and_requests_wait_for_the_client() -> None:
    auth = {"Authorization": "Bearer sk-acme"}
    async with TestClient(TestServer(build_app(state()))) as client:
        models = await (await client.get("/v1/models", headers=auth)).json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        bad = await client.post("/v1/completions", data=b"{", headers=auth)
        assert bad.status == 400
        early = await client.post("/v1/completions", headers=auth,
                                  json={"model": "smollm2", "prompt": "why?"})
        assert early.status == 503
        assert (await early.json())["error"]["code"] == "not_ready"


async def test_metrics_count_every_request_by_route_and_status() -> None:
    auth = {"Authorization": "Bearer sk-acme"}
    async with TestClient(TestServer(build_app(state()))) as client:
        await client.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer x"})
        await client.post("/v1/completions", headers=auth, json={"model": "smollm2", "prompt": "?"})
        await client.get("/no/such/path", headers=auth)
        assert (await client.get("/metrics")).status == 401  # behind the key, like /v1
        text = await (await client.get("/metrics", headers=auth)).text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    requests = "ragwarm_gateway_requests_total"
    assert samples[(requests, (("route", "/v1/chat/completions"), ("status", "401")))] == 1
    assert samples[(requests, (("route", "/v1/completions"), ("status", "503")))] == 1
    assert samples[(requests, (("route", "unmatched"), ("status", "404")))] == 1
    assert samples[(requests, (("route", "/metrics"), ("status", "401")))] == 1
    duration = "ragwarm_gateway_request_duration_seconds_count"
    assert samples[(duration, (("route", "/v1/completions"),))] == 1


async def test_models_lists_the_aliases_and_an_alias_passes_the_model_check() -> None:
    auth = {"Authorization": "Bearer sk-acme"}
    gateway = build_app(state(model_aliases=["gpt-4o-mini", "gpt-4o"]))
    async with TestClient(TestServer(gateway)) as client:
        models = await (await client.get("/v1/models", headers=auth)).json()
        assert [m["id"] for m in models["data"]] == ["smollm2", "gpt-4o-mini", "gpt-4o"]
        alias = await client.post("/v1/chat/completions", headers=auth, json={
            "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "why?"}]})
        assert alias.status == 503  # past the model check, waiting for the client
        other = await client.post("/v1/chat/completions", headers=auth, json={
            "model": "gpt-5", "messages": [{"role": "user", "content": "why?"}]})
        assert other.status == 404
        assert (await other.json())["error"]["code"] == "model_not_found"


def test_empty_keys_are_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="empty API key"):
        GatewaySettings(keys={"acme": SecretStr("")})
    with pytest.raises(ValidationError, match="operator key is empty"):
        GatewaySettings(operator_key=SecretStr(""))


def test_aliases_read_from_a_comma_separated_variable(monkeypatch) -> None:
    monkeypatch.setenv("RAGWARM_GATEWAY_MODEL_ALIASES", "gpt-4o-mini, gpt-4o")
    assert GatewaySettings().model_aliases == ["gpt-4o-mini", "gpt-4o"]
