"""The official `openai` SDK against `ragwarm gateway` on a real stack (streams, worker, Kafka)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from ragwarm.stack.procs import Proc
from schemas.topics import KB_CHANGES, RAG_QUERIES
from tests.integration.kb_stack import gateway_proc, index_docs, logged_query

pytestmark = pytest.mark.integration

DOCS = ("docs/faq.md",)
QUESTION = "I forgot the admin password, how do I reset it?"
KEY = "sk-ragwarm-test"
ANSWER_TOKENS = 12  # long enough to hold a stop sequence, short on two shared CPU cores


def start_gateway(workdir, app, bootstrap: str, namespace: str) -> Proc:
    return gateway_proc(workdir, {
        "RAGWARM_CLIENT_STREAMS_URL": app.url, "RAGWARM_KAFKA_BOOTSTRAP": bootstrap,
        "RAGWARM_KAFKA_TOPIC_PREFIX": namespace,
        "RAGWARM_GATEWAY_KEYS": json.dumps({"default": KEY}),
        "RAGWARM_GATEWAY_MODEL_ALIASES": "gpt-4o-mini,gpt-4o", "RAGWARM_CLIENT_MAX_TOKENS": "4"})


@pytest.mark.timeout(1200)  # a stack, then ten requests on the real model
def test_the_openai_sdk_gets_warm_answers_through_the_gateway(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory, tmp_path
):
    env = {"RAGWARM_STREAMS_HOT_MIN_COUNT": "1000"}
    app = streams_factory(namespace, "gateway", env).start()
    worker = worker_factory("g1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace)
    worker.start()
    changes = index_docs(app, [worker], kafka_producer, namespace, DOCS)
    gateway = start_gateway(tmp_path, app, kafka_bootstrap, namespace)
    try:
        base_url = gateway.health_url.removesuffix("/health/ready") + "/v1"
        client = OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
        ask_twice_stream_and_refuse(client, base_url, kafka_bootstrap, namespace)
        stop_at_sequences_and_answer_an_alias(client, base_url)
    finally:
        gateway.stop()
    streams = scrape(app.url)
    assert streams[("ragwarm_streams_kb_events_total", ())] >= len(changes)
    assert streams[("ragwarm_streams_messages_received_total",
                    (("topic", namespace + KB_CHANGES),))] >= len(changes)
    assert streams[("ragwarm_streams_queries_total", ())] >= 1
    assert streams[("ragwarm_streams_table_entries", (("table", "docs"),))] >= 1
    served = scrape(worker.url)
    assert sum(v for (n, _), v in served.items()
               if n == "vllm:time_to_first_token_seconds_count") >= 4
    assert served[("ragwarm_worker_warmup_hits_total", ())] >= 1
    assert max(v for (n, _), v in served.items() if n == "vllm:kv_cache_usage_perc") > 0


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple], float]:
    """`/metrics` of a process as {(sample name, sorted labels): value}."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def ask_twice_stream_and_refuse(client: OpenAI, base_url: str, bootstrap: str,
                                namespace: str) -> None:
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    second = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    extra = second.model_extra["ragwarm"]
    assert "docs/faq.md" in extra["doc_ids"] and extra["prefix_tokens"] > 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The retrieved prefix (its full blocks) was computed once and reused the second time.
    assert cached >= extra["prefix_tokens"] // 16 * 16, (cached, extra)
    assert second.choices[0].message.content and second.usage.completion_tokens >= 1
    assert first.usage.prompt_tokens == second.usage.prompt_tokens

    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.prompt_tokens_details.cached_tokens >= cached

    completion = client.completions.create(model=model, prompt=QUESTION, max_tokens=4)
    assert completion.choices[0].text and completion.usage.prompt_tokens_details.cached_tokens

    with pytest.raises(openai.AuthenticationError) as err:
        OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0).chat.completions.create(
            model=model, messages=messages, max_tokens=4)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"

    logged = logged_query(bootstrap, namespace + RAG_QUERIES, extra["qid"])
    assert logged.cached_tokens == cached and logged.worker_id == "g1"

    gateway = scrape(base_url.removesuffix("/v1"), {"Authorization": f"Bearer {KEY}"})
    chat = "/v1/chat/completions"
    assert gateway[("ragwarm_gateway_requests_total", (("route", chat), ("status", "200")))] == 3
    assert gateway[("ragwarm_gateway_requests_total", (("route", chat), ("status", "401")))] == 1
    assert gateway[("ragwarm_gateway_request_duration_seconds_count", (("route", chat),))] == 4
    assert gateway[("ragwarm_gateway_answers_total", (("stream", "true"),))] == 1
    assert gateway[("ragwarm_gateway_cached_tokens_total", ())] >= 2 * cached
    assert gateway[("ragwarm_gateway_retrieval_duration_seconds_count", ())] == 4
    assert gateway[("ragwarm_gateway_failovers_total", ())] == 0


def stop_at_sequences_and_answer_an_alias(client: OpenAI, base_url: str) -> None:
    """`stop` cuts the answer where the SDK asked; an alias of the model gets an answer."""
    assert httpx.get(base_url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
    names = [m.id for m in client.models.list().data]
    assert names[1:] == ["gpt-4o-mini", "gpt-4o"]
    messages = [{"role": "user", "content": QUESTION}]
    full = client.chat.completions.create(model="gpt-4o-mini", messages=messages,
                                          max_tokens=ANSWER_TOKENS, temperature=0)
    assert full.model == "gpt-4o-mini" and full.choices[0].message.content
    text = full.choices[0].message.content
    # A stop sequence the greedy answer surely holds, beside "\n" (which it may not).
    middle = text[len(text) // 2:len(text) // 2 + 2]
    stops = ["\n", middle]
    expected = text[:min(i for i in (text.find(s) for s in stops) if i >= 0)]
    stopped = client.chat.completions.create(model="gpt-4o-mini", messages=messages,
                                             max_tokens=ANSWER_TOKENS, temperature=0,
                                             stop=stops)
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop" and "\n" not in expected
    chunks = list(client.chat.completions.create(
        model=names[0], messages=messages, max_tokens=ANSWER_TOKENS, temperature=0, stop=stops,
        stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    completion = client.completions.create(model="gpt-4o", prompt=QUESTION,
                                           max_tokens=ANSWER_TOKENS, temperature=0, stop=["\n"])
    assert "\n" not in completion.choices[0].text
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=names[0], messages=messages, top_p=0.5)
    assert err.value.code == "unsupported_parameter" and err.value.param == "top_p"
