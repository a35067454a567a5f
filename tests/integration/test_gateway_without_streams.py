"""Issue 40: with the streams app stopped, the gateway still answers, retrieving from its own
replica of rag.chunks and routing by its own view of worker.events, and a prompt the worker
computed before still reports cached tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from ragwarm.client.view import EVENTS
from ragwarm.stack.procs import Proc
from tests.integration.kb_stack import QUESTION, gateway_proc, index_docs
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.integration

KEY = "sk-ragwarm-test"
OTHER = "How do I disable the admin user?"


def own_path_env(app, bootstrap: str, namespace: str) -> dict[str, str]:
    return {"RAGWARM_CLIENT_STREAMS_URL": app.url, "RAGWARM_KAFKA_BOOTSTRAP": bootstrap,
            "RAGWARM_KAFKA_TOPIC_PREFIX": namespace,
            "RAGWARM_GATEWAY_RETRIEVAL": "replica", "RAGWARM_CLIENT_MAX_TOKENS": "4"}


def start_gateway(workdir, app, bootstrap: str, namespace: str) -> Proc:
    return gateway_proc(workdir, own_path_env(app, bootstrap, namespace) | {
        "RAGWARM_GATEWAY_KEYS": json.dumps({"default": KEY})})


def ask(base_url: str, model: str, question: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/chat/completions", timeout=300,
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": model, "max_tokens": 4,
                            "messages": [{"role": "user", "content": question}]})


def model_of(base_url: str) -> str:
    models = httpx.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                       timeout=10).json()
    return models["data"][0]["id"]


@pytest.mark.timeout(1200)  # a stack, the replica's catch-up, then a few answers on CPU
def test_the_gateway_answers_warm_after_the_streams_app_stops(
    kafka_bootstrap, kafka_producer, namespace, streams_factory, worker_factory, tmp_path
):
    env = {"RAGWARM_STREAMS_WORKER_STALE_S": "900", "RAGWARM_STREAMS_HOT_MIN_COUNT": "1000"}
    app = streams_factory(namespace, "gwdown", env).start()
    worker = worker_factory("gd1", kafka_bootstrap=kafka_bootstrap, topic_prefix=namespace)
    worker.start()
    index_docs(app, [worker], kafka_producer, namespace, ("docs/faq.md",))
    gateway = start_gateway(tmp_path, app, kafka_bootstrap, namespace)
    base_url = gateway.health_url.removesuffix("/health/ready")
    try:
        model = model_of(base_url)
        # 503 (the replica is still reading rag.chunks) until it has caught up.
        wait_for(lambda: ask(base_url, model, QUESTION).status_code == 200, 300, "the replica")
        warm = ask(base_url, model, QUESTION).json()
        assert warm["model"] == model
        assert warm["ragwarm"]["routing"] == EVENTS and warm["ragwarm"]["worker_id"] == "gd1"
        assert "docs/faq.md" in warm["ragwarm"]["doc_ids"]
        cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0

        app.stop()
        after = ask(base_url, model, QUESTION)
        assert after.status_code == 200, after.text
        body = after.json()
        assert body["ragwarm"]["routing"] == EVENTS and body["ragwarm"]["worker_id"] == "gd1"
        assert body["ragwarm"]["failed_workers"] == []
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached
        assert body["usage"]["prompt_tokens"] == warm["usage"]["prompt_tokens"]
        assert body["choices"][0]["message"]["content"]

        # A question never asked: retrieved from the replica, answered cold where it must be.
        other = ask(base_url, model, OTHER)
        assert other.status_code == 200, other.text
        assert other.json()["ragwarm"]["doc_ids"] and other.json()["usage"]["completion_tokens"]
    finally:
        gateway.stop()

    # Opened while the app is down: a gateway started now, and a `ragwarm query` process.
    late = start_gateway(tmp_path / "late", app, kafka_bootstrap, namespace)
    late_url = late.health_url.removesuffix("/health/ready")
    try:
        wait_for(lambda: ask(late_url, model, QUESTION).status_code == 200, 300,
                 "the late gateway's replica")
        body = ask(late_url, model, QUESTION).json()
        assert body["ragwarm"]["routing"] == EVENTS and body["ragwarm"]["worker_id"] == "gd1"
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached
    finally:
        late.stop()
    env = os.environ | own_path_env(app, kafka_bootstrap, namespace)
    done = subprocess.run([sys.executable, "-m", "ragwarm", "query", QUESTION, "--json"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Answering without it" in done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert (answer["routing"], answer["worker_id"]) == (EVENTS, "gd1")
    assert answer["cached_tokens"] >= cached

    # A long-lived process's blocking client keeps the gateway's path in-process.
    from ragwarm.client.independent import OwnPath
    from ragwarm.client.settings import ClientSettings
    from ragwarm.client.standalone import StandaloneClient
    from ragwarm.client.view import ViewRules
    from ragwarm.settings import KafkaSettings

    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=namespace)
    settings = ClientSettings(streams_url=app.url, max_tokens=4)
    with StandaloneClient.open(settings, kafka, OwnPath("replica", ViewRules(None))) as client:
        assert client.wait_replica(300)
        own = client.query(QUESTION)
        assert (own.routing, own.worker_id) == (EVENTS, "gd1")
        assert own.cached_tokens >= cached
